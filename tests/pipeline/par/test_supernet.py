"""The PAR search space (``pipeline.par.supernet``) and the ``par_search`` stage's frozen-θ callback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.attention import ENTMAX
from pipeline.par.search import FrozenArchitecture
from pipeline.par.stacks import CrossAttention, FeedForward, SelfAttention
from pipeline.par.supernet import (
    CHOICES,
    IDENTITY,
    MixedSublayer,
    architecture_parameters,
    build_supernet,
    mixing_weights,
    searched_patterns,
)
from tests.tiny import dropout_free_marian, padded_batch

VOCAB, LAYERS = 30, 2


def teacher() -> torch.nn.Module:
    return dropout_free_marian(vocab=VOCAB, attn_implementation=ENTMAX)


def supernet(temperature: float = 1.0) -> torch.nn.Module:
    model = teacher()
    build_supernet(model, temperature)
    return model


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return module.state_dict()


def test_every_position_mixes_candidates_copied_from_its_teacher_layer():
    original, model = teacher(), supernet()
    assert CHOICES == ("s", "f", IDENTITY)
    for stack in ("encoder", "decoder"):
        layers = getattr(model.model, stack).layers
        owners = getattr(original.model, stack).layers
        per_layer = 2 if stack == "encoder" else 3
        assert len(layers) == per_layer * LAYERS
        for i, sublayer in enumerate(layers):
            owner = owners[i // per_layer]
            if stack == "decoder" and i % 3 == 1:
                assert isinstance(sublayer, CrossAttention)
                candidates = [sublayer]
            else:
                assert isinstance(sublayer, MixedSublayer)
                assert isinstance(sublayer.attention, SelfAttention)
                assert isinstance(sublayer.feed_forward, FeedForward)
                assert torch.equal(sublayer.architecture.detach(), torch.zeros(3))
                candidates = [sublayer.attention, sublayer.feed_forward]
            for candidate in candidates:
                for part in candidate.PARTS:
                    mine, theirs = state(getattr(candidate, part)), state(getattr(owner, part))
                    assert mine.keys() == theirs.keys()
                    assert all(torch.equal(mine[k], theirs[k]) for k in mine), (stack, i, part)
    assert len(architecture_parameters(model)) == 4 * LAYERS


def test_theta_on_the_teachers_choices_gives_back_the_teacher():
    original, model = teacher(), supernet()
    with torch.no_grad():
        for stack in ("encoder", "decoder"):
            mixed = [m for m in getattr(model.model, stack).layers if isinstance(m, MixedSublayer)]
            for position, sublayer in enumerate(mixed):  # s, f, s, f, … from the embeddings up
                sublayer.architecture.copy_(torch.tensor([100.0, 0.0, 0.0]).roll(position % 2))
    batch = padded_batch(VOCAB)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**batch).logits, original(**batch).logits, rtol=0, atol=1e-5)
        uniform = supernet().eval()(**batch).logits
    assert not torch.allclose(uniform, original(**batch).logits, atol=1e-2)


def test_training_gives_every_theta_a_gradient():
    model = supernet().train()
    batch = padded_batch(VOCAB)
    labels = batch["decoder_input_ids"].masked_fill(batch["decoder_attention_mask"] == 0, -100)
    torch.manual_seed(0)
    model(**batch, labels=labels).loss.backward()
    thetas = architecture_parameters(model)
    assert len(thetas) == 4 * LAYERS
    for theta in thetas:
        assert theta.grad is not None and theta.grad.abs().min() > 0, theta.grad
    blocks = [p for p in model.parameters() if all(p is not t for t in thetas)]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in blocks)


def test_mixing_is_drawn_in_training_and_the_softmax_in_evaluation():
    model = supernet(temperature=0.5)
    sublayer = model.model.encoder.layers[0]
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)

    sublayer.eval()
    torch.testing.assert_close(sublayer.mixing(), torch.full((3,), 1 / 3))
    with torch.no_grad():
        expected = (sublayer.attention(x, mask) + sublayer.feed_forward(x, mask) + x) / 3
        torch.testing.assert_close(sublayer(x, mask), expected)
        sublayer.architecture.copy_(torch.tensor([1.0, -1.0, 0.5]))
    torch.testing.assert_close(sublayer.mixing(), torch.tensor([1.0, -1.0, 0.5]).softmax(-1))

    sublayer.train()
    torch.manual_seed(0)
    draws = torch.stack([sublayer.mixing() for _ in range(200)])
    torch.testing.assert_close(draws.sum(-1), torch.ones(200))
    assert draws.std(0).min() > 0.05  # one Gumbel-softmax draw per forward
    assert draws.argmax(-1).bincount(minlength=3).argmax() == 0  # θ's favourite is drawn most often


def test_mixing_weights_table():
    model = supernet()
    table = mixing_weights(model)
    uniform = dict.fromkeys(CHOICES, round(1 / 3, 4))
    assert table["encoder"] == [uniform] * (2 * LAYERS)
    assert len(table["decoder"]) == 3 * LAYERS
    assert [i for i, p in enumerate(table["decoder"]) if p == "c"] == [1, 4]
    assert all(p == uniform for i, p in enumerate(table["decoder"]) if i % 3 != 1)
    with torch.no_grad():
        model.model.decoder.layers[3].architecture.copy_(torch.tensor([0.0, 2.0, 1.0]))
    probabilities = torch.tensor([0.0, 2.0, 1.0]).softmax(-1)
    position = mixing_weights(model)["decoder"][3]
    assert position == {c: round(p, 4) for c, p in zip(CHOICES, probabilities.tolist(), strict=True)}
    assert position["f"] > position[IDENTITY] > position["s"]


def weights(s: float, f: float, identity: float) -> dict[str, float]:
    return {"s": s, "f": f, IDENTITY: identity}


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (  # the argmax everywhere, identity dropped, cross-attention kept where it is
            {
                "encoder": [weights(0.6, 0.3, 0.1), weights(0.1, 0.2, 0.7), weights(0.2, 0.5, 0.3)],
                "decoder": [weights(0.5, 0.4, 0.1), "c", weights(0.1, 0.8, 0.1), weights(0.2, 0.1, 0.7), "c"],
            },
            {"encoder": "sf", "decoder": "scfc"},
        ),
        (  # a decoder without self-attention: the position most likely to be s becomes s
            {
                "encoder": [weights(0.1, 0.2, 0.7), weights(0.1, 0.6, 0.3)],
                "decoder": [weights(0.2, 0.7, 0.1), "c", weights(0.3, 0.1, 0.6), weights(0.25, 0.7, 0.05)],
            },
            {"encoder": "f", "decoder": "fcsf"},
        ),
        (  # an encoder of identities only: its most attention-like position is kept as s
            {
                "encoder": [weights(0.1, 0.1, 0.8), weights(0.3, 0.1, 0.6), weights(0.2, 0.1, 0.7)],
                "decoder": [weights(0.1, 0.1, 0.8), "c", weights(0.05, 0.25, 0.7)],
            },
            {"encoder": "s", "decoder": "sc"},
        ),
        (  # feed-forward alone is enough for an encoder: nothing is forced
            {
                "encoder": [weights(0.3, 0.1, 0.6), weights(0.1, 0.8, 0.1)],
                "decoder": [weights(0.6, 0.1, 0.3), "c", weights(0.5, 0.1, 0.4)],
            },
            {"encoder": "f", "decoder": "scs"},
        ),
    ],
    ids=["argmax", "decoder-forced", "encoder-forced", "encoder-feed-forward"],
)
def test_searched_patterns(table, expected):
    assert searched_patterns(table) == expected


def test_searched_patterns_of_a_fresh_supernet_are_all_attention():
    patterns = searched_patterns(mixing_weights(supernet()))  # uniform: ties go to the first choice, s
    assert patterns == {"encoder": "ssss", "decoder": "scsscs"}


def test_frozen_architecture_drops_theta_gradients_below_the_step():
    theta = torch.nn.Parameter(torch.zeros(3))
    block = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW(
        [{"params": [block], "lr": 0.1}, {"params": [theta], "lr": 0.1, "weight_decay": 0.5}]
    )
    callback = FrozenArchitecture([theta], steps=2)
    history = []
    for step in range(4):
        optimizer.zero_grad()
        state = SimpleNamespace(global_step=step)
        callback.on_step_begin(None, state, None)
        (theta * torch.tensor([1.0, -2.0, 3.0])).sum().add((block**2).sum()).backward()
        # while frozen θ's gradient is zero as computed, so it adds nothing to the clipping norm
        assert torch.equal(theta.grad, torch.zeros(3)) == (step < 2), step
        callback.on_pre_optimizer_step(None, state, None)
        assert (theta.grad is None) == (step < 2), step
        assert block.grad is not None  # the blocks learn throughout
        before = block.detach().clone()
        optimizer.step()
        assert not torch.equal(block.detach(), before)
        history.append(theta.detach().clone())
    assert torch.equal(history[0], torch.zeros(3)) and torch.equal(history[1], torch.zeros(3))
    assert torch.all(history[2] != 0) and not torch.equal(history[3], history[2])
    assert torch.all(history[3].sign() == torch.tensor([-1.0, 1.0, -1.0]))
