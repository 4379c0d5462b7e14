"""Figures drawn on matplotlib's Agg canvas (no display needed) and saved as PNG atomically."""

from __future__ import annotations

import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.atomic import atomic_path


def new_figure(width: float = 8.0, height: float = 5.0) -> Figure:
    """An empty figure of ``width`` × ``height`` inches on an Agg canvas."""
    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: Figure, path: str | os.PathLike) -> None:
    """Write ``figure`` to ``path`` as PNG, atomically."""
    with atomic_path(path) as tmp:
        # "tight" keeps a legend placed outside the axes inside the image
        figure.savefig(tmp, format="png", bbox_inches="tight")
