"""Anisotropy correction fitted on the indexed texts: mean-centering, or BERT-whitening
(Su et al. 2021) with optional dimension reduction. Raw BERT cosines are all high; moving the
mean to the origin and making the covariance isotropic spreads them out.

Fitted once on the corpus, stored in the index, and applied unchanged to every query.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput, IndexDamaged

KINDS = ("none", "center", "whiten")


@dataclass(frozen=True)
class Transform:
    mean: np.ndarray
    matrix: np.ndarray | None  # [dim, out_dim] for whitening; None for centering only

    @classmethod
    def fit(cls, kind: str, vectors: np.ndarray, dims: int | None = None) -> Transform:
        return cls.fit_parts(kind, [vectors], dims)

    @classmethod
    def fit_parts(cls, kind: str, parts: Iterable[np.ndarray], dims: int | None = None) -> Transform:
        """Fitted on vectors that come in parts (a streamed corpus): only sums are kept, in float64
        and around the first part's mean (so the large common mean of BERT vectors costs no
        precision), never the vectors themselves."""
        if kind not in KINDS[1:]:
            raise BadInput(f"unknown post-processing {kind!r}: use one of {', '.join(KINDS)}")
        n, shift, total, products = 0, None, None, None
        for part in parts:
            part = np.asarray(part, dtype=np.float64)
            if not len(part):
                continue
            if shift is None:
                shift = part.mean(axis=0)
                total = np.zeros_like(shift)
                products = np.zeros((len(shift), len(shift))) if kind == "whiten" else None
            part -= shift
            n += len(part)
            total += part.sum(axis=0)
            if products is not None:
                products += part.T @ part
        if n < 2:
            raise BadInput(f"{kind} needs at least 2 texts to fit on")
        offset = total / n
        mean = shift + offset
        if kind == "center":
            return cls(mean.astype(np.float32), None)
        out_dim = dims or len(mean)
        if out_dim > len(mean):
            raise BadInput(f"whitening to {out_dim} dimensions: vectors only have {len(mean)}")
        covariance = (products - n * np.outer(offset, offset)) / (n - 1)
        u, s, _ = np.linalg.svd(covariance)
        # a floor on the variances keeps directions the corpus never varies in from exploding
        matrix = u[:, :out_dim] / np.sqrt(np.maximum(s[:out_dim], max(1e-6 * s[0], 1e-12)))
        return cls(mean.astype(np.float32), matrix.astype(np.float32))

    @classmethod
    def for_strategy(cls, strategy: Strategy, fit_on: np.ndarray | Iterable[np.ndarray]) -> Transform | None:
        """The strategy's post-processing fitted on ``fit_on`` (vectors, or parts of them), or
        None when it has none."""
        if strategy.postprocess == "none":
            return None
        parts = [fit_on] if isinstance(fit_on, np.ndarray) else fit_on
        return cls.fit_parts(strategy.postprocess, parts, strategy.whiten_dims)

    @staticmethod
    def apply_optional(transform: Transform | None, vectors: np.ndarray) -> np.ndarray:
        return vectors if transform is None else transform.apply(vectors)

    @property
    def dimension(self) -> int | None:
        return None if self.matrix is None else self.matrix.shape[1]

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """Transformed, L2-normalised float32 vectors (cosine is all that is compared after)."""
        out = np.asarray(vectors, dtype=np.float32) - self.mean
        if self.matrix is not None:
            out = out @ self.matrix
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.maximum(norms, 1e-12)).astype(np.float32)

    def save(self, path: Path) -> None:
        arrays = {"mean": self.mean}
        if self.matrix is not None:
            arrays["matrix"] = self.matrix
        with path.open("wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path) -> Transform:
        try:
            with np.load(path) as data:
                return cls(data["mean"], data.get("matrix"))
        except (OSError, ValueError, KeyError) as exc:
            raise IndexDamaged(f"damaged index: cannot read {path.name}: {exc}") from None
