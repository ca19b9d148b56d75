"""Studies that measure and fit a strategy on labels, and so write: ``evaluate`` and ``sweep``
build temporary indexes, ``calibration`` stores its no-answer rule in the index's meta,
``abstention`` scores such rules, ``tuning`` fine-tunes and saves a model. They stand on the read
path and the writers, never the other way."""
