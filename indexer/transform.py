"""Anisotropy correction fitted on the indexed texts: mean-centering, or BERT-whitening
(Su et al. 2021) with optional dimension reduction. Raw BERT cosines are all high; moving the
mean to the origin and making the covariance isotropic spreads them out.

Fitted once on the corpus, stored in the index, and applied unchanged to every query.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.errors import BadInput, IndexDamaged
from indexer.strategy import Strategy

KINDS = ("none", "center", "whiten")


@dataclass(frozen=True)
class Transform:
    mean: np.ndarray
    matrix: np.ndarray | None  # [dim, out_dim] for whitening; None for centering only

    @classmethod
    def fit(cls, kind: str, vectors: np.ndarray, dims: int | None = None) -> Transform:
        if kind not in KINDS[1:]:
            raise BadInput(f"unknown post-processing {kind!r}: use one of {', '.join(KINDS)}")
        vectors = np.asarray(vectors, dtype=np.float64)
        if len(vectors) < 2:
            raise BadInput(f"{kind} needs at least 2 texts to fit on")
        mean = vectors.mean(axis=0)
        if kind == "center":
            return cls(mean.astype(np.float32), None)
        out_dim = dims or vectors.shape[1]
        if out_dim > vectors.shape[1]:
            raise BadInput(f"whitening to {out_dim} dimensions: vectors only have {vectors.shape[1]}")
        covariance = np.cov(vectors - mean, rowvar=False)
        u, s, _ = np.linalg.svd(covariance)
        # a floor on the variances keeps directions the corpus never varies in from exploding
        matrix = u[:, :out_dim] / np.sqrt(np.maximum(s[:out_dim], max(1e-6 * s[0], 1e-12)))
        return cls(mean.astype(np.float32), matrix.astype(np.float32))

    @classmethod
    def for_strategy(cls, strategy: Strategy, fit_on: np.ndarray) -> Transform | None:
        """The strategy's post-processing fitted on ``fit_on``, or None when it has none."""
        if strategy.postprocess == "none":
            return None
        return cls.fit(strategy.postprocess, fit_on, strategy.whiten_dims)

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
