"""Writing an index and getting vectors out of one: build, add/delete, shards and their merge,
Ray, exported encoders, output files."""
