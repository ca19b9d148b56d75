"""The modules of a sentence-transformers model folder, one kind per file, as
sentence-transformers' own ``models/``: each kind owns the keys it reads from its config, the
refusal of a config it cannot reproduce, its load, its save, its forward (NumPy, or torch tensors
in fine-tuning), its ONNX form and its files (what an index holds and a fingerprint covers). The
folder reader only walks ``modules.json`` and asks the registry (``base.KINDS``) for each kind,
so a new kind is one file and one registry line.
"""
