"""The names an index directory is made of: its files and the meta keys the store itself reads."""

import re

FORMAT_VERSION = 1
CURRENT = "CURRENT"
LOCK = ".lock"
VECTORS = "vectors.faiss"
DATABASE = "meta.db"
TRANSFORM = "transform.npz"
FILES = "files"
"""Meta key: ``{file name: [size, crc32]}`` of every file of the version but ``meta.db``, written
at commit (a segment's in its own update's transaction)."""
PREVIOUS = "previous"
"""Meta key: the version that was live before this one."""
VERSION_NAME = re.compile(r"v-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")
MAX_POINTER = 256
"""Bytes read from CURRENT: a version name is 27."""
