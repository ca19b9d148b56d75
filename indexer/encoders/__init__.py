"""Texts -> vectors: every way semsearch runs a model lives in this package, and only here are
torch and onnxruntime imported (``tests/test_encoders.py`` checks it).

- ``base``: the ``Encoder`` protocol every caller types against, ``Decision`` (what the factory
  decided and why: runtime, placement, batching, Ray) and ``NetworkEncoder`` (tokens -> network ->
  ``indexer.embedding.head``, shared by the backends that run in this process).
- ``options``: ``EmbeddingOptions``, the one object that travels from the caller to the factory.
- ``tokens``: the model's tokenizer as every encoder uses it (truncation, chunking, special ids).
- ``torch_encoder``: the transformers model on torch (the reference; sweeps and word vectors).
- ``onnx_graph``: an exported graph (``GraphSpec``: where it is cached) run on ONNX Runtime,
  on an execution provider of the caller's choice; ``onnx_export`` exports one (needs torch).
- ``onnx_encoder``: ONNX Runtime + ``tokenizers`` alone (no torch): the read path, and indexing
  once a graph is cached.
- ``factory``: ``decide`` and ``encoder_for``, the one place that picks an encoder by strategy and
  options and says why; ``torch_encoder`` for what needs the model itself.
- ``on_ray``: the encoder whose workers embed on Ray, as the factory decided.
- ``words``: contextual word vectors.

``docs/architecture.md`` says where a new backend or execution provider goes.
"""
