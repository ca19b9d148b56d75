"""A text file's bytes -> its lines, decoded in blocks (memory bounded by the longest line, itself
bounded by ``MAX_TEXT``): the encoding asked for, a leading BOM dropped, and a file mostly in
another encoding stopped with one line that names the encoding to try. Shared by every reader of
text: corpora, stdin, labels."""

from __future__ import annotations

import codecs
import gzip
import re
import stat
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from indexer.errors import BadInput

SURROGATE = re.compile("[\udc80-\udcff]")
"""What bytes that are not UTF-8 decode to (``surrogateescape``)."""
_BLOCK = 1 << 20
MAX_TEXT = 1 << 25
"""The most characters a line, a field or a JSON array's element may hold (32 MiB of ASCII): a
long document many times over, yet a bound on what one costs in memory, so that a gzip bomb's
line of gigabytes is refused once it passes the bound rather than read whole first."""
GZIP_SUFFIX = ".gz"
"""A file named so is gzip (so is one that starts with gzip's magic bytes): read as the text it holds."""
_GZIP_MAGIC = b"\x1f\x8b"


class TooLong(BadInput):
    """A line, a field or a JSON array's element longer than ``MAX_TEXT``, refused as soon as it
    passes it; a reader that knows the row it is in says so (``named``)."""

    line: int | None = None
    row: int | None = None
    what = "line"

    @classmethod
    def at(cls, path: Path | str, line: int | None, row: int | None = None, what: str = "line") -> TooLong:
        """``what``: ``line`` (the line itself), ``field`` (a quoted field running on over lines)
        or ``element`` (of a JSON array, named by its row)."""
        where = f"row {row}" if not line else f"line {line} (row {row})" if row else f"line {line}"
        said = {
            "line": f"{where} is longer than",
            "field": f"{where} holds a field longer than",
            "element": f"{where} (an element of the JSON array) is longer than",
        }[what]
        error = cls(f"{path}: {said} {MAX_TEXT >> 20} MiB, the most a line or a field may hold")
        error.line, error.row, error.what = line, row, what
        return error

    def named(self, path: Path | str, row: int, lines: bool = True) -> TooLong:
        """This refusal naming the row it is in, and the file (or rows) as ``path``; ``lines``:
        whether the rows have lines (rows given in Python do not)."""
        return TooLong.at(path, self.line if lines else None, self.row or row, self.what)


def open_file(path: Path, once: bool = False) -> BinaryIO:
    """The file opened for reading in binary, or why it cannot be, as one ``BadInput`` line; a
    gzip file (``GZIP_SUFFIX`` or gzip's magic bytes) gives the bytes it holds, so every reader of
    text reads it. ``once``: it is read once (ids, queries), so a pipe (``<(...)``, a FIFO) will
    do; a corpus is read more than once, so it must be a file."""
    if not path.exists():
        raise BadInput(f"no such file: {path}")
    if path.is_dir() or not (path.is_file() or once):
        if stat.S_ISFIFO(path.stat().st_mode):
            raise BadInput(f"{path} is a pipe: a corpus is read more than once, so write it to a file first")
        raise BadInput(f"not a file: {path}")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix.lower() == GZIP_SUFFIX or handle.peek(len(_GZIP_MAGIC)).startswith(_GZIP_MAGIC):
        return _Gunzipped(path, handle)
    return handle


class _Gunzipped(gzip.GzipFile):
    """A gzip file's text, read from ``handle`` (peeked at, never reopened: a pipe is read once),
    which it closes with itself; gzip that does not decompress is one ``BadInput`` naming it."""

    def __init__(self, path: Path, handle: BinaryIO):
        super().__init__(fileobj=handle, mode="rb")
        self.path, self.source = path, handle

    def read(self, size: int | None = -1) -> bytes:
        try:
            return super().read(size)
        except EOFError:
            raise BadInput(f"cannot read {self.path}: its gzip data is cut short") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise BadInput(f"cannot read {self.path}: not valid gzip data ({exc})") from None

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.source.close()


def check_encoding(encoding: str) -> str:
    """``encoding`` if Python has a text codec by that name; else one clear error."""
    try:
        codec = codecs.lookup(encoding)
    except LookupError:
        raise BadInput(f"unknown encoding {encoding!r}: try utf-8, cp1252, latin-1 or utf-16") from None
    if not getattr(codec, "_is_text_encoding", True):
        raise BadInput(f"{encoding!r} is not a text encoding: try utf-8, cp1252, latin-1 or utf-16")
    return encoding


def read_lines(path: Path | str, handle: BinaryIO, encoding: str = "utf-8") -> Iterator[str]:
    """The file's lines with their ends: a line ends at ``\n`` (``\r\n`` is one end), as
    ``wc -l`` counts, read in blocks (memory bounded by the longest line, and a line longer
    than ``MAX_TEXT`` refused once a block takes it past that: ``TooLong``). A leading BOM is
    dropped; bytes ``encoding`` cannot decode become surrogates, which reject their row, unless
    so many lines hold them that the file is in another encoding: then one error naming it."""
    check = Decoding(path, encoding)
    parts: list[str] = []  # the line being read, one piece per block
    held = 0  # the characters in ``parts``
    number = 0  # lines read
    for text in blocks(path, handle, encoding, check):
        *ended, rest = text.split("\n")
        for piece in ended:
            if held + len(piece) > MAX_TEXT:
                raise TooLong.at(path, number + 1)
            line = "".join([*parts, piece, "\n"]) if parts else piece + "\n"
            parts, held = [], 0
            number += 1
            check.line(line, number)
            yield line
        held += len(rest)
        if held > MAX_TEXT:  # refused before the rest of the line is read
            raise TooLong.at(path, number + 1)
        if rest:
            parts.append(rest)
    if parts:
        check.line("".join(parts), number + 1)
        yield "".join(parts)
    check.end()


def blocks(path: Path | str, handle: BinaryIO, encoding: str, check: Decoding) -> Iterator[str]:
    """The file's text, decoded a block at a time (a character cut by a block's end is in the
    next), without a leading BOM; bytes ``encoding`` cannot decode become surrogates."""
    decoder = codecs.getincrementaldecoder(check_encoding(encoding))(errors="surrogateescape")
    first = True
    while True:
        try:
            block = handle.read(_BLOCK)
        except OSError as exc:
            raise BadInput(f"cannot read {path}: {exc.strerror}") from None
        if first and block:
            check.start(block)
        text = decoder.decode(block, final=not block)
        if first and text:
            text, first = text.removeprefix("\ufeff"), False
        if text:
            yield text
        if not block:
            return


def line_text(line: str) -> str:
    """A line without its end (``\n`` or ``\r\n``)."""
    return line.removesuffix("\n").removesuffix("\r")


def lines_of(source: str | Path, encoding: str = "utf-8") -> list[str]:
    """The lines of a small text file (ids, queries, judgements), or of stdin for ``-``, without
    their ends: split as ``read_lines`` splits a corpus. Every line counts here, so one that
    ``encoding`` cannot decode is an error naming it."""
    if str(source) == "-":
        lines = [line_text(line) for line in read_lines("stdin", sys.stdin.buffer, encoding)]
    else:
        with open_file(Path(source), once=True) as handle:
            lines = [line_text(line) for line in read_lines(source, handle, encoding)]
    for number, line in enumerate(lines, 1):
        if SURROGATE.search(line):
            hint = guess_encoding(line.encode(encoding, "surrogateescape"), encoding)
            raise BadInput(f"{source} line {number} is not valid {encoding.upper()}: {hint}")
    return lines


_DECODED = re.compile("[^\x00-\x7f\udc80-\udcff]")
_NOT_CP1252 = re.compile("[\udc81\udc8d\udc8f\udc90\udc9d]")
"""What the bytes cp1252 has no character for decode to (``surrogateescape``)."""
EARLY = 5
"""The first lines with text: all of them undecodable, the file is in another encoding."""
UNDECODABLE_SHARE = 0.25
"""More than this share of a file's lines undecodable: it is in another encoding."""


class Decoding:
    """Counts the lines ``read_lines`` could not decode, and stops a file in another encoding
    with one line that says which to try, before anything is made of its rows: the first lines,
    over a quarter of them, or any when every byte that failed is one cp1252 reads and nothing
    decoded beyond ASCII (a UTF-8 file has no reason to hold such bytes alone; a cp1252 export
    of mostly ASCII text looks just so). A file that is UTF-8 read as a one-byte encoding (its
    byte order mark, or every line beyond ASCII valid UTF-8: 'CafÃ©'), or UTF-16 without a byte
    order mark read as anything else, is refused too: each would be read whole, as mojibake.
    Rows are counted by their reader (a CSV row may take many lines): ``indexer.reading.mismatch``."""

    def __init__(self, path: Path | str, encoding: str):
        self.path, self.encoding = path, encoding
        self.lines = self.bad = 0
        self.sample = b""
        self.first = ""
        """Where the first line that did not decode is, and its bytes, as a refusal says it."""
        name = codecs.lookup(encoding).name
        self.utf8 = name == "utf-8"
        self.unicode = name.startswith(("utf-8", "utf-16", "utf-32"))
        self.one_byte = not self.unicode and _reads_ascii(encoding)
        """Whether a UTF-8 file would read as mojibake (a one-byte encoding: latin-1, cp1252...)."""
        self.as_utf8: str | None = None
        """The first line beyond ASCII, as ``encoding`` reads it, when it is valid UTF-8."""
        self.only_utf8 = True
        """Whether every line beyond ASCII is valid UTF-8."""
        self.beyond_ascii = False
        """Whether a line holds a character that is not ASCII and decoded (UTF-8 of 2 bytes or more)."""
        self.cp1252 = True
        """Whether every byte that did not decode is one cp1252 reads."""

    def start(self, block: bytes) -> None:
        utf16 = block.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        if utf16 and not codecs.lookup(self.encoding).name.startswith(("utf-16", "utf-32")):
            raise BadInput(
                f"{self.path} starts with a UTF-16 byte order mark (it is not {self.encoding}): "
                "try --encoding utf-16"
            )
        if block.startswith(codecs.BOM_UTF8) and not codecs.lookup(self.encoding).name.startswith("utf-8"):
            raise BadInput(
                f"{self.path} starts with a UTF-8 byte order mark (it is not {self.encoding}): "
                "try --encoding utf-8"
            )
        wide = codecs.lookup(self.encoding).name.startswith(("utf-16", "utf-32"))
        order = None if wide else utf16_order(block)
        if order:
            raise BadInput(
                f"{self.path} is UTF-16 without a byte order mark ({order}-endian: a NUL byte "
                f"beside each ASCII character), not {self.encoding}: try --encoding utf-16-{order[0]}e"
            )

    def line(self, line: str, number: int | None = None) -> None:
        """Count ``line`` (the file's line ``number``, when it is one: a JSON array's element is not)."""
        if not line.strip():
            return
        self.lines += 1
        if line.isascii():
            return
        self.beyond_ascii = self.beyond_ascii or bool(_DECODED.search(line))
        if self.one_byte and self.only_utf8:
            try:
                line.encode(self.encoding, "surrogateescape").decode("utf-8")
            except UnicodeError:
                self.only_utf8 = False
            else:
                self.as_utf8 = self.as_utf8 or line
        if SURROGATE.search(line):
            self.bad += 1
            self.cp1252 = self.cp1252 and not _NOT_CP1252.search(line)
            if not self.sample:
                self.sample = line.encode(self.encoding, "surrogateescape")
                found = bytes_named(ord(char) - 0xDC00 for char in SURROGATE.findall(line))
                self.first = f" (line {number}: {found})" if number else ""
            if self.bad == self.lines == EARLY:
                self.fail(f"the first {EARLY} lines")

    def end(self) -> None:
        if self.as_utf8 and self.only_utf8:
            word = _WORD.search(self.as_utf8).group()
            raise BadInput(
                f"{self.path} reads as UTF-8: every byte beyond ASCII is UTF-8, which {self.encoding} "
                f"would read as mojibake ({word!r}): try --encoding utf-8"
            )
        if self.bad > self.lines * UNDECODABLE_SHARE:
            self.fail(f"{self.bad} of {self.lines} lines")
        if self.bad and self.utf8 and self.cp1252 and not self.beyond_ascii:
            lines = f"{self.bad} of {self.lines} lines" + (" is" if self.bad == 1 else " are")
            raise BadInput(
                f"{self.path}: {lines} not valid UTF-8 and no line is UTF-8 beyond ASCII; "
                "looks like cp1252/latin-1: try --encoding cp1252"
            )

    def fail(self, lines: str) -> None:
        hint = guess_encoding(self.sample, self.encoding)
        raise BadInput(f"{self.path}: {lines} are not valid {self.encoding.upper()}; {hint}{self.first}")


_WORD = re.compile(r"\w*[^\x00-\x7f]+\w*")


def _reads_ascii(encoding: str) -> bool:
    """Whether ``encoding`` reads the bytes 0-127 as ASCII (latin-1, cp1252; not UTF-16)."""
    ascii_bytes = bytes(range(128))
    return ascii_bytes.decode(encoding, "replace") == ascii_bytes.decode("ascii")


def utf16_order(block: bytes) -> str | None:
    """``little`` or ``big`` when the block's start is UTF-16 text of that byte order without a
    byte order mark (a NUL beside each ASCII character, on the same side); else None."""
    sample = block[: 4096 & ~1]
    pairs = len(sample) // 2
    if pairs < 2:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    if odd >= pairs / 2 and even <= pairs / 20:
        return "little"
    if even >= pairs / 2 and odd <= pairs / 20:
        return "big"
    return None


def bytes_named(raw: Iterable[int]) -> str:
    """``byte 0x9d`` or ``bytes 0xe8, 0xe9``: the bytes that did not decode, the first three."""
    found = sorted(set(raw))
    shown = ", ".join(f"0x{byte:02x}" for byte in found[:3]) + (", ..." if len(found) > 3 else "")
    return ("byte " if len(found) == 1 else "bytes ") + shown


def guess_encoding(sample: bytes, tried: str) -> str:
    """What to try for a line ``tried`` could not decode: cp1252 (Windows' Western European,
    which reads latin-1's printable characters alike) when it decodes the line, else latin-1
    (which decodes any byte)."""
    for encoding in ("cp1252", "latin-1"):
        if codecs.lookup(encoding).name == codecs.lookup(tried).name:
            continue
        try:
            sample.decode(encoding)
        except UnicodeDecodeError:
            continue
        label = "cp1252/latin-1" if encoding == "cp1252" else encoding
        return f"looks like {label}: try --encoding {encoding}"
    return "give its encoding with --encoding"
