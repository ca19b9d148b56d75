"""A sweep's outputs beside its printed table: every cell as CSV, and a heatmap of layers x
pooling (needs matplotlib)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from indexer.embedding.strategy import POOLINGS
from indexer.files import make_parents
from search.studies.sweep import Cell, best_first, reproduce


def output_file(path: Path) -> Path:
    """An output path whose directory exists (made if missing), or one clear error."""
    make_parents(path)
    return path


def write_csv(cells: Sequence[Cell], path: Path) -> None:
    metrics = list(cells[0].scores)
    with output_file(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "layers", "combine", "pooling", "postprocess", *metrics, "options"])
        for c in cells:
            s = c.strategy
            layers = ",".join(map(str, s.layers or ()))
            writer.writerow(
                [
                    c.row,
                    layers,
                    s.combine,
                    s.pooling,
                    s.postprocess,
                    *[c.scores[m] for m in metrics],
                    reproduce(s),
                ]
            )


def write_heatmap(cells: Sequence[Cell], metric: str, path: Path, title: str) -> None:
    """Layers x pooling, one panel per post-processing, the best cell boxed (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys(c.row for c in sorted(cells, key=lambda c: _row_order(c.row))))
    cols = [p for p in POOLINGS if any(c.strategy.pooling == p for c in cells)]
    posts = list(dict.fromkeys(c.strategy.postprocess for c in cells))
    best = best_first(list(cells), metric)[0]
    fig, axes = plt.subplots(
        1, len(posts), figsize=(2.2 + 1.3 * len(cols) * len(posts), 1.2 + 0.38 * len(rows)), squeeze=False
    )
    for ax, post in zip(axes[0], posts, strict=True):
        grid_values = np.full((len(rows), len(cols)), np.nan)
        for c in cells:
            if c.strategy.postprocess == post:
                grid_values[rows.index(c.row), cols.index(c.strategy.pooling)] = c.scores[metric]
        image = ax.imshow(grid_values, cmap="viridis", aspect="auto")
        for (i, j), value in np.ndenumerate(grid_values):
            if not np.isnan(value):
                ax.text(
                    j,
                    i,
                    f"{value:.3g}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if value < np.nanmean(grid_values) else "black",
                )
        if best.strategy.postprocess == post:
            i, j = rows.index(best.row), cols.index(best.strategy.pooling)
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
        ax.set_xticks(range(len(cols)), cols, fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_title(f"postprocess: {post}", fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.04)
    fig.suptitle(f"{title}: {metric} (best boxed: {best.row}, {best.strategy.pooling})", fontsize=10)
    fig.tight_layout()
    fig.savefig(output_file(path), dpi=110)
    plt.close(fig)


def _row_order(label: str) -> tuple[int, int]:
    if label.startswith("layer "):
        return (0, int(label.split()[1]))
    return (1, ["last4 sum", "last4 mean", "last4 concat", "first-last mean"].index(label))
