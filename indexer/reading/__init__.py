"""Reading a corpus: files (CSV, TSV, JSON Lines, JSON arrays, text) or rows given in Python
-> entries."""
