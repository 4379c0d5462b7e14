"""HeadProjections: per-head linear maps, shared option, safetensors round trip."""

import json

import pytest
import torch
from safetensors import safe_open

from pipeline.errors import UserError
from pipeline.projection.model import HeadProjections, load_projections, save_projections


@pytest.mark.parametrize("shared", [False, True])
def test_forward_is_one_linear_map_per_head(shared):
    module = HeadProjections(3, 8, 4, shared=shared, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 5, 8, generator=gen), torch.randn(2, 3, 6, 8, generator=gen)
    q_proj, k_proj = module(q, k)
    assert q_proj.shape == (2, 3, 5, 4) and k_proj.shape == (2, 3, 6, 4)
    k_weight, k_bias = (module.q_weight, module.q_bias) if shared else (module.k_weight, module.k_bias)
    for h in range(3):
        assert torch.allclose(q_proj[:, h], q[:, h] @ module.q_weight[h].T + module.q_bias[h], atol=1e-6)
        assert torch.allclose(k_proj[:, h], k[:, h] @ k_weight[h].T + k_bias[h], atol=1e-6)
    assert len(list(module.parameters())) == (2 if shared else 4)


def test_initialisation_follows_the_generator():
    a = HeadProjections(2, 8, generator=torch.Generator().manual_seed(5))
    b = HeadProjections(2, 8, generator=torch.Generator().manual_seed(5))
    c = HeadProjections(2, 8, generator=torch.Generator().manual_seed(6))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.q_weight, c.q_weight)


def test_save_load_round_trip(tmp_path):
    layers = {
        0: HeadProjections(2, 8, 4, generator=torch.Generator().manual_seed(0)),
        3: HeadProjections(2, 8, 2, shared=True, generator=torch.Generator().manual_seed(1)),
    }
    path = tmp_path / "projections.safetensors"
    save_projections(path, layers, {"teacher": "abc", "omega": 1.0})
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == [
            "layer0.k_bias", "layer0.k_weight", "layer0.q_bias", "layer0.q_weight",
            "layer3.q_bias", "layer3.q_weight",
        ]  # fmt: skip
        header = json.loads(f.metadata()["projections"])
    assert header["layers"]["3"] == {"n_heads": 2, "head_dim": 8, "rank": 2, "shared": True}
    loaded, extra = load_projections(path)
    assert extra == {"teacher": "abc", "omega": 1.0}
    assert sorted(loaded) == [0, 3]
    for idx, module in layers.items():
        assert loaded[idx].config() == module.config()
        for (name, p), (_, p2) in zip(module.named_parameters(), loaded[idx].named_parameters(), strict=True):
            assert torch.equal(p, p2), name


def test_loading_a_foreign_file_fails_clearly(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(1)}, str(path))
    with pytest.raises(UserError, match="not a projections file"):
        load_projections(path)
