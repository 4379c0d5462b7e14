"""HeadProjections: per-head linear maps or tanh MLPs, shared option, safetensors round trip."""

import json

import pytest
import torch
from safetensors import safe_open

from pipeline.errors import UserError
from pipeline.projection.model import FORMAT_VERSION, HeadProjections, load_projections, save_projections
from pipeline.tensor_file import write_tensor_file


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


# ----------------------------------------------------------------------------------------------------------
# tanh MLP projector: x → W tanh(V x + c) + b per head


@pytest.mark.parametrize("shared", [False, True])
def test_mlp_forward_is_one_tanh_mlp_per_head(shared):
    module = HeadProjections(3, 8, 4, shared=shared, hidden=5, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 5, 8, generator=gen), torch.randn(2, 3, 6, 8, generator=gen)
    q_proj, k_proj = module(q, k)
    assert q_proj.shape == (2, 3, 5, 4) and k_proj.shape == (2, 3, 6, 4)
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    q_shapes = {
        "q_hidden_weight": (3, 5, 8), "q_hidden_bias": (3, 5), "q_weight": (3, 4, 5), "q_bias": (3, 4),
    }  # fmt: skip
    k_shapes = {name.replace("q_", "k_", 1): shape for name, shape in q_shapes.items()}
    assert shapes == (q_shapes if shared else {**q_shapes, **k_shapes})
    k_side = "q" if shared else "k"
    for h in range(3):
        for x, out, side in [(q, q_proj, "q"), (k, k_proj, k_side)]:
            p = {name: getattr(module, f"{side}_{name}")[h] for name in ("hidden_weight", "hidden_bias")}
            p |= {name: getattr(module, f"{side}_{name}")[h] for name in ("weight", "bias")}
            expected = (
                torch.tanh(x[:, h] @ p["hidden_weight"].T + p["hidden_bias"]) @ p["weight"].T + p["bias"]
            )
            assert torch.allclose(out[:, h], expected, atol=1e-6)


def test_mlp_gradients_are_those_of_tanh():
    """The hidden layer's tanh, computed as 2σ(2u) − 1 with its constants folded into the maps,
    backpropagates as tanh does."""
    module = HeadProjections(2, 8, 3, hidden=6, generator=torch.Generator().manual_seed(4)).double()
    x = torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    x.requires_grad_()
    weight = torch.randn(1, 2, 7, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    (module.project_queries(x) * weight).sum().backward()
    hidden = torch.tanh(x @ module.q_hidden_weight.mT.unsqueeze(0) + module.q_hidden_bias[:, None, :])
    expected = hidden @ module.q_weight.mT.unsqueeze(0) + module.q_bias[:, None, :]
    params = [x, module.q_hidden_weight, module.q_hidden_bias, module.q_weight, module.q_bias]
    grads = torch.autograd.grad((expected * weight).sum(), params)
    for param, grad in zip(params, grads, strict=True):
        torch.testing.assert_close(param.grad, grad, rtol=1e-12, atol=1e-12)


def test_shared_mlp_maps_queries_and_keys_alike():
    module = HeadProjections(2, 8, 3, shared=True, hidden=6, generator=torch.Generator().manual_seed(2))
    x = torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(3))
    q_proj, k_proj = module(x, x)
    assert torch.equal(q_proj, k_proj)
    assert len(list(module.parameters())) == 4
    separate = HeadProjections(2, 8, 3, hidden=6, generator=torch.Generator().manual_seed(2))
    assert len(list(separate.parameters())) == 8
    assert not torch.equal(*separate(x, x))


def test_mlp_initialisation_is_per_map_fan_in_and_seeded():
    a = HeadProjections(2, 64, 4, hidden=16, generator=torch.Generator().manual_seed(5))
    b = HeadProjections(2, 64, 4, hidden=16, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert a.q_hidden_weight.abs().max() <= 1 / 64**0.5 < a.q_weight.abs().max() <= 1 / 16**0.5


def test_linear_config_has_no_hidden_key_and_mlp_config_has_one():
    assert "hidden" not in HeadProjections(2, 8).config()
    assert HeadProjections(2, 8, hidden=None).config() == HeadProjections(2, 8).config()
    config = HeadProjections(2, 8, 3, shared=True, hidden=12).config()
    assert config == {"n_heads": 2, "head_dim": 8, "rank": 3, "shared": True, "hidden": 12}
    assert HeadProjections(**config).config() == config  # how a saved sparsefinder model rebuilds it
    with pytest.raises(ValueError, match="hidden"):
        HeadProjections(2, 8, hidden=0)


def test_mlp_save_load_round_trip(tmp_path):
    layers = {
        0: HeadProjections(2, 8, 4, hidden=16, generator=torch.Generator().manual_seed(0)),
        1: HeadProjections(2, 8, 4, shared=True, hidden=5, generator=torch.Generator().manual_seed(1)),
        2: HeadProjections(2, 8, 4, generator=torch.Generator().manual_seed(2)),  # a linear layer beside
    }
    path = tmp_path / "projections.safetensors"
    save_projections(path, layers, {"kind": "decoder_self"})
    with safe_open(str(path), framework="pt") as f:
        names = f.keys()
        assert sorted(k for k in names if k.startswith("layer1.")) == [
            "layer1.q_bias", "layer1.q_hidden_bias", "layer1.q_hidden_weight", "layer1.q_weight",
        ]  # fmt: skip
        assert f.get_tensor("layer0.k_hidden_weight").shape == (2, 16, 8)
        header = json.loads(f.metadata()["projections"])
    assert header["layers"]["0"]["hidden"] == 16 and "hidden" not in header["layers"]["2"]
    loaded, extra = load_projections(path)
    assert extra == {"kind": "decoder_self"}
    x = torch.randn(3, 2, 6, 8, generator=torch.Generator().manual_seed(9))
    for idx, module in layers.items():
        assert loaded[idx].config() == module.config()
        assert loaded[idx].hidden == module.hidden
        for (name, p), (name2, p2) in zip(
            module.named_parameters(), loaded[idx].named_parameters(), strict=True
        ):
            assert name == name2 and torch.equal(p, p2), name
        assert all(torch.equal(a, b) for a, b in zip(module(x, x), loaded[idx](x, x), strict=True))


def test_a_file_without_hidden_loads_as_linear(tmp_path):
    """Files written before the MLP option: the header has no ``hidden`` key and only the linear tensors."""
    gen = torch.Generator().manual_seed(4)
    tensors = {"layer0.q_weight": torch.randn(2, 3, 8, generator=gen), "layer0.q_bias": torch.randn(2, 3)}
    config = {"n_heads": 2, "head_dim": 8, "rank": 3, "shared": True}
    header = {"format_version": FORMAT_VERSION, "layers": {"0": config}, "extra": {}}
    path = tmp_path / "old.safetensors"
    write_tensor_file(path, tensors, "projections", header)
    module = load_projections(path)[0][0]
    assert module.hidden is None and module.config() == header["layers"]["0"]
    x = torch.randn(1, 2, 5, 8, generator=gen)
    expected = (
        torch.einsum("bhnd,hrd->bhnr", x, tensors["layer0.q_weight"]) + tensors["layer0.q_bias"][:, None]
    )
    assert torch.equal(module.project_queries(x), expected)
