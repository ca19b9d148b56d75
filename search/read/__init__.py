"""The read path: a question becomes a vector and the vector becomes hits. Query files and request
checks, filters, the hybrid fusion and its confidence, the snapshot an index is read through, the
engine over it, vectors out (``encoding``), sentence ranking (``similar``) and duplicate scans.
Nothing here writes an index or imports the writers."""
