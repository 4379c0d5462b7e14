"""Differentiable top-k without replacement: hard forward, the soft proxy's gradient, small pools."""

from __future__ import annotations

import torch

from pipeline.attention.topk import gather_items, soft_proxy, straight_through_pick, top_k_split


def test_the_top_k_are_selected_and_the_next_k_compete_in_order():
    scores = torch.tensor([[0.5, 3.0, -1.0, 2.0, 1.0, float("-inf"), 4.0]])
    selected, competing = top_k_split(scores, 2)
    assert selected.tolist() == [[6, 1]] and competing.tolist() == [[3, 4]]
    selected, competing = top_k_split(scores[:, :3], 2)  # fewer than 2k: fewer competitors
    assert selected.tolist() == [[1, 0]] and competing.tolist() == [[2]]
    selected, competing = top_k_split(scores[:, :3], 5)  # at most k: everything is selected
    assert selected.tolist() == [[1, 0, 2]] and competing.shape == (1, 0)


def test_the_forward_is_exactly_the_selected_items_and_the_backward_the_proxys():
    g = torch.Generator().manual_seed(0)
    items = torch.randn(2, 7, 3, generator=g, requires_grad=True)  # (B, P, d)
    scores = torch.randn(2, 4, 7, generator=g, requires_grad=True)  # (B, Q, P): every query ranks the pool
    selected, competing = top_k_split(scores.detach(), 3)
    picked = straight_through_pick(items, scores, selected, competing, 0.5)
    assert torch.equal(picked, gather_items(items.detach(), selected))
    weights = torch.randn(picked.shape, generator=g)
    (picked * weights).sum().backward()
    ours = items.grad.clone(), scores.grad.clone()
    items.grad = scores.grad = None
    (soft_proxy(items, scores, selected, competing, 0.5) * weights).sum().backward()
    torch.testing.assert_close(ours, (items.grad, scores.grad), rtol=0, atol=0)
    assert scores.grad.abs().sum() > 0
    with torch.no_grad():  # inference: the selected items alone
        assert torch.equal(straight_through_pick(items, scores, selected, competing, 0.5), picked)


def test_the_proxy_by_hand_for_one_selected_item_and_one_competitor():
    x1, x2 = torch.tensor([1.0, 2.0]), torch.tensor([-3.0, 0.5])
    items = torch.stack([x2, x1])[None].requires_grad_(True)  # (1, 2, 2): item 1 wins
    s = torch.tensor([[[0.2, 0.9]]], requires_grad=True)  # (1, 1, 2)
    tau = 0.5
    picked = straight_through_pick(items, s, torch.tensor([[[1]]]), torch.tensor([[[0]]]), tau)
    assert torch.equal(picked[0, 0, 0], x1)
    g = torch.tensor([0.7, -1.1])
    (picked[0, 0, 0] * g).sum().backward()
    p = torch.sigmoid(torch.tensor((0.9 - 0.2) / tau))  # proxy = p x1 + (1 − p) x2
    torch.testing.assert_close(items.grad[0, 1], p * g)
    torch.testing.assert_close(items.grad[0, 0], (1 - p) * g)
    ds = p * (1 - p) / tau * ((x1 - x2) * g).sum()
    torch.testing.assert_close(s.grad[0, 0], torch.stack([-ds, ds]))


def test_the_proxy_matches_finite_differences():
    g = torch.Generator().manual_seed(1)
    items = torch.randn(1, 6, 2, generator=g, dtype=torch.float64, requires_grad=True)
    scores = torch.randn(1, 2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    scores.data[0, 1, 4] = float("-inf")  # absent for the second query: never a competitor
    selected, competing = top_k_split(scores.detach(), 3)
    assert (competing[0, 1] == 4).any()

    def proxy(items, finite):
        full = scores.detach().clone()
        full[full.isfinite()] = finite
        return soft_proxy(items, full, selected, competing, 0.7)

    finite = scores.detach()[scores.isfinite()].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(proxy, (items, finite))


def test_absent_competitors_and_small_pools_pass_the_gradient_through():
    items = torch.randn(1, 3, 2, requires_grad=True)
    scores = torch.tensor([[[1.0, float("-inf"), float("-inf")]]], requires_grad=True)
    selected, competing = top_k_split(scores.detach(), 1)  # one finite item, two absent competitors
    picked = straight_through_pick(items, scores, selected, competing, 1.0)
    picked.sum().backward()
    assert items.grad[0, 0].tolist() == [1.0, 1.0] and (items.grad[0, 1:] == 0).all()
    assert torch.isfinite(scores.grad).all() and (scores.grad == 0).all()
