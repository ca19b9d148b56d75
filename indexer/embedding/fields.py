"""Two vectors per entry, one score: an entry's text (``--text-field``) and a second text made of
other fields (``--also``, e.g. question and answer) are embedded apart, and a query scores each
entry ``(1 - weight) * cos(q, text) + weight * cos(q, also)``.

Why: a FAQ question alone matches paraphrases of it well but cannot tell apart entries that share
it (one question, several answers); question+answer does, and the sum beats either (StackFAQ dev,
docs/faq-fields.md).

Both vector sets live in the one vector index, under ids that ``indexer.vectors.entries`` gives
and maps back to their entry. The configuration is saved in the index meta (``source.also``) and
read back by every query.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from indexer.embedding.strategy import ALSO_WEIGHT
from indexer.errors import BadInput
from indexer.progress import Share
from indexer.reading.corpus import Entry, field_text, nearest, spelled

if TYPE_CHECKING:
    from indexer.embedding.head import Tokenized


@dataclass(frozen=True)
class FieldScoring:
    """Which fields make the second text (joined by a space, like ``--text-field``) and the share
    of its cosine in an entry's score."""

    also: tuple[str, ...]
    weight: float = ALSO_WEIGHT

    def __post_init__(self) -> None:
        object.__setattr__(self, "also", tuple(str(f).strip() for f in self.also))
        if not self.also or not all(self.also):
            raise BadInput("--also: name the field(s) of the second text, comma-separated: question,answer")
        if not 0 <= self.weight <= 1:
            raise BadInput(f"--also-weight must be in [0, 1], not {self.weight}")

    def texts(self, entries: Sequence[Entry]) -> list[str]:
        """Each entry's second text; an entry whose also fields are all empty uses its text. A field
        name matches whatever its case (as the text and id fields do)."""
        present = {name for e in entries for name in e.fields}
        names = [spelled(f, present) or f for f in self.also]
        missing = [f for f, name in zip(self.also, names, strict=True) if entries and name not in present]
        if missing:
            raise BadInput(
                f"--also: no entry has field {missing[0]!r}{nearest(missing[0], present)}; "
                f"fields are: {', '.join(sorted(present))}"
            )
        return [field_text(e.fields, names) or e.text for e in entries]

    def combine(self, text_scores: np.ndarray, also_scores: np.ndarray) -> np.ndarray:
        return (1 - self.weight) * text_scores + self.weight * also_scores

    def to_dict(self) -> dict[str, Any]:
        return {"fields": list(self.also), "weight": self.weight}

    @classmethod
    def asked(cls, fields: Sequence[str] | None, weight: float | None = None) -> FieldScoring | None:
        """What ``--also FIELDS [--also-weight W]`` ask for (None: no also fields)."""
        if not fields:
            if weight is not None:
                raise BadInput("--also-weight needs --also FIELDS")
            return None
        return cls(tuple(fields), ALSO_WEIGHT if weight is None else weight)

    @classmethod
    def given(cls, also: FieldScoring | str | Sequence[str] | None) -> FieldScoring | None:
        """What the Python API's ``also=`` gives: a ``FieldScoring``, field names (a list, or
        comma-separated as on the command line) with the default weight; None or no names: none."""
        if also is None or isinstance(also, FieldScoring):
            return also
        names = also.split(",") if isinstance(also, str) else list(also)
        return cls.asked([str(name).strip() for name in names if str(name).strip()])

    @classmethod
    def from_source(cls, source: Mapping[str, Any]) -> FieldScoring | None:
        """The scoring an index's ``source`` meta saved, or None for one vector per entry."""
        stored = source.get("also")
        return cls(tuple(stored["fields"]), float(stored["weight"])) if stored else None


class Embeds(Protocol):
    """What ``embed_entries`` needs of an encoder (``indexer.encoders.base.Encoder`` is one; one
    given ``tokens`` is a ``NetworkEncoder``, which also embeds ids tokenised ahead)."""

    def embed_documents(
        self, texts: Sequence[str], *, progress: Share | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...


class EmbedsIds(Embeds, Protocol):
    """An encoder that also embeds texts tokenised ahead (``indexer.encoders.base.NetworkEncoder``)."""

    def embed_ids(self, ids: Sequence[Sequence[int]], *, progress: Share | None = None) -> np.ndarray: ...


def entry_texts(entries: Sequence[Entry], scoring: FieldScoring | None) -> list[str]:
    """The texts the entries embed: each one's text, then (with ``scoring``) each one's also text."""
    texts = [e.text for e in entries]
    if scoring is not None:
        texts += scoring.texts(entries)
    return texts


def embed_entries(
    encoder: Embeds,
    entries: Sequence[Entry],
    scoring: FieldScoring | None,
    *,
    progress: Share | None = None,
    tokens: Tokenized | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectors of the entries' texts (and, with ``scoring``, of their also texts): (vectors,
    owners = entry position of each vector, also = whether it is an also-vector). ``tokens``:
    ``entry_texts`` already tokenised as documents by the encoder's tokenizer (a build tokenises
    the next part while this one embeds)."""
    if tokens is None:
        vectors, owners = encoder.embed_documents(entry_texts(entries, scoring), progress=progress)
    else:
        vectors = cast("EmbedsIds", encoder).embed_ids(tokens.ids, progress=progress)
        owners = tokens.owners
    also = owners >= len(entries)
    return vectors, owners % max(len(entries), 1), also
