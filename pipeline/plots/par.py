"""PAR's search result as the paper's Figure 2: the probability of each choice at every position."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from pipeline.par.pattern import CROSS, Stack, compact_pattern
from pipeline.par.supernet import CHOICES
from pipeline.plots.canvas import new_figure, save_png


def plot_mixing_weights(
    table: Mapping[Stack, list[dict[str, float] | str]],
    patterns: Mapping[Stack, str],
    path: str | os.PathLike,
) -> None:
    """One heat map per stack, choices × positions (bottom to top of the stack left to right), brighter =
    more probable, each cell annotated; the decoder's kept cross-attention positions are marked ``c``."""
    figure = new_figure(9.0, 2.2 * len(table))
    axes = figure.subplots(len(table), 1, squeeze=False)[:, 0]
    for ax, (stack, positions) in zip(axes, table.items(), strict=True):
        grid = np.full((len(CHOICES), len(positions)), np.nan)
        for column, position in enumerate(positions):
            if isinstance(position, str):
                ax.text(column, 1, CROSS, ha="center", va="center", fontsize=11, color="0.3")
            else:
                grid[:, column] = [position[choice] for choice in CHOICES]
                for row, choice in enumerate(CHOICES):
                    ax.text(column, row, f"{position[choice]:.2f}", ha="center", va="center", fontsize=7)
        image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_yticks(range(len(CHOICES)), CHOICES)
        ax.set_xticks(range(len(positions)))
        ax.set_xlabel("position (from the embeddings up)")
        ax.set_title(f"{stack}: searched {compact_pattern(patterns[stack])}", fontsize=10)
        figure.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    figure.tight_layout()
    save_png(figure, path)
