"""PAR's search figure: the mixing weights per position, one heat map per stack."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.image import imread

from pipeline.plots.par import plot_mixing_weights

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def weights(s: float, f: float, identity: float) -> dict[str, float]:
    return {"s": s, "f": f, "identity": identity}


TABLE = {
    "encoder": [
        weights(0.7, 0.2, 0.1),
        weights(0.1, 0.8, 0.1),
        weights(0.2, 0.1, 0.7),
        weights(0.1, 0.9, 0.0),
    ],
    "decoder": [
        weights(0.6, 0.3, 0.1),
        "c",
        weights(0.1, 0.8, 0.1),
        weights(0.2, 0.2, 0.6),
        "c",
        weights(0.0, 1.0, 0.0),
    ],
}
PATTERNS = {"encoder": "sff", "decoder": "scfcf"}


def test_the_mixing_weights_plot_is_a_readable_png(tmp_path: Path):
    path = tmp_path / "plots" / "par_search.png"
    path.parent.mkdir()
    plot_mixing_weights(TABLE, PATTERNS, path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5_000
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 500, image.shape
    assert image[..., :3].std() > 0.02  # drawn, not one flat colour
    assert [p.name for p in path.parent.iterdir()] == ["par_search.png"]  # nothing temporary left


def test_one_stack_is_drawn_too(tmp_path: Path):
    path = tmp_path / "encoder.png"
    plot_mixing_weights({"encoder": TABLE["encoder"]}, PATTERNS, path)
    both = tmp_path / "both.png"
    plot_mixing_weights(TABLE, PATTERNS, both)
    one, two = imread(path), imread(both)
    assert path.read_bytes().startswith(PNG_MAGIC)
    assert one.shape[0] < two.shape[0]  # one heat map per stack, stacked vertically
