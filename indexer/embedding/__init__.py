"""How a text becomes a vector: the model, the strategy, the head (layers, pooling),
post-processing, also-fields and word vectors."""
