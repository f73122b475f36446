"""verify_chain is exact: committed tokens are distributed as draws from p, whatever q is.

Leviathan et al. 2023, Thm. 1; Chen et al. 2023, Thm. 1. Checked by chi-square goodness of fit on small
vocabularies with 10^5 trials per case, and a deliberately broken rule must fail the same test.

Setup: the target's law at output position t is a fixed p_t and the draft's a fixed q_t (no context
dependence), so exact speculative sampling must emit independent tokens with x_t ~ p_t. A trial repeats
verify_chain from the first uncommitted position until two tokens are committed; the first committed
token is tested against p_0 and the first two jointly against p_0 x p_1.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_core import verify
from specdec_core.sampling import sample
from specdec_core.verify import ChainVerdict, one_hot, residual, verify_chain
from tests.gof import ALPHA, gof

V = 8
TRIALS = 100_000


def run_trials(p: torch.Tensor, q: torch.Tensor, k: int, rule=verify_chain, trials: int = TRIALS,
               seed: int = 0) -> np.ndarray:
    """p: [k+2, V] target law per output position, q: [k+1, V] draft law per position.
    Returns [V, V] counts of the first two committed tokens."""
    gen = torch.Generator().manual_seed(seed)
    # drafts for the first step (positions 0..k-1) and for a second step from position 1, drawn in bulk
    d0 = torch.stack([torch.multinomial(q[i], trials, replacement=True, generator=gen) for i in range(k)], 1)
    d1 = torch.stack([torch.multinomial(q[i + 1], trials, replacement=True, generator=gen) for i in range(k)], 1)
    counts = np.zeros((V, V), dtype=np.int64)
    for t in range(trials):
        v = rule(p[:k + 1], q[:k], d0[t], gen)
        out = d0[t, :v.n_accepted].tolist() + [v.token]
        if len(out) < 2:
            v = rule(p[1:k + 2], q[1:k + 1], d1[t], gen)
            out += d1[t, :v.n_accepted].tolist() + [v.token]
        counts[out[0], out[1]] += 1
    return counts


def dist(seed: int, n: int, sharp: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(n, V, generator=g), -1)


def case(name: str, k: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    p, q = dist(1, k + 2), dist(2, k + 1)
    if name == "random":
        pass
    elif name == "one-hot":
        # a deterministic draft: a likely token, one the target never emits, then an unlikely one
        p[1, 5] = 0
        p = p / p.sum(-1, keepdim=True)
        q = one_hot(torch.stack([p[0].argmax(), torch.tensor(5), p[2].argmin()])[:k + 1], V)
    elif name == "zeros":
        # q is zero on tokens 0..2 where p is positive (they can only come from the residual), and p is
        # zero on tokens 5..7 where q is positive (the draft proposes what the target never emits)
        q[:, :3] = 0
        p[:, 5:] = 0
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    elif name == "disjoint":
        p[:, 4:] = 0
        q[:, :4] = 0    # every draft is rejected: the residual is p itself
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    elif name == "equal":
        q = p[:k + 1].clone()  # never rejects: the residual is empty and only bonus tokens are drawn
    else:
        raise KeyError(name)
    return p, q


# 10^5 trials for the main cases; the two edge cases are also checked exactly (every draft rejected /
# every draft accepted), so fewer trials suffice for their goodness of fit
CASES = [("random", 3, TRIALS), pytest.param("one-hot", 2, TRIALS, marks=pytest.mark.long),
         pytest.param("zeros", 2, TRIALS, marks=pytest.mark.long),
         ("disjoint", 2, TRIALS // 5), ("equal", 2, TRIALS // 5)]


@pytest.mark.parametrize("name,k,trials", CASES)
def test_chain_is_exact(name, k, trials, one_thread):
    p, q = case(name, k)
    counts = run_trials(p, q, k, trials=trials)
    p0, p1 = p[0].numpy(), p[1].numpy()
    first = gof(counts.sum(1), p0)
    joint = gof(counts, np.outer(p0, p1))
    assert first > ALPHA, f"{name}: first committed token does not follow p_0 (p-value {first:.2e})"
    assert joint > ALPHA, f"{name}: first two committed tokens do not follow p_0 x p_1 (p-value {joint:.2e})"


def accept_always(p, q, draft, gen) -> ChainVerdict:
    """Broken: keeps every drafted token and draws the bonus from p_k."""
    k = draft.numel()
    one = torch.ones(k)
    return ChainVerdict(k, int(sample(p[k], gen)), "bonus", one, one, one, one, p[k])


@pytest.mark.parametrize("broken", ["resample-from-p", "accept-always"])
def test_broken_rule_is_rejected(broken, monkeypatch, one_thread):
    """The same test catches the classic mistakes, even with a fifth of the trials."""
    p, q = case("random", 2)
    rule = verify_chain
    if broken == "resample-from-p":
        # accept with min(1, p/q) but on rejection redraw from p instead of norm(max(0, p - q))
        monkeypatch.setattr(verify, "residual", lambda p_, q_: p_)
    else:
        rule = accept_always
    counts = run_trials(p, q, 2, rule=rule, trials=TRIALS // 5)
    pval = gof(counts.sum(1), p[0].numpy())
    assert pval < ALPHA, f"broken rule {broken} passed the goodness-of-fit test (p-value {pval:.2e})"


def test_gof_accepts_and_rejects():
    """The helper itself: exact multinomial draws pass, a shifted law and an impossible outcome fail."""
    rng = np.random.default_rng(0)
    probs = np.array([0.5, 0.3, 0.2, 0.0, 1e-6])
    assert gof(rng.multinomial(TRIALS, probs / probs.sum()), probs) > ALPHA
    assert gof(rng.multinomial(TRIALS, [0.49, 0.31, 0.2, 0, 0]), probs) < ALPHA
    assert gof(np.array([50, 30, 19, 1, 0]), probs) == 0.0


def test_edge_cases_exactly():
    """Disjoint supports reject every draft; equal laws accept every draft (the residual is empty)."""
    gen = torch.Generator().manual_seed(0)
    for name, n_expected, kind in [("disjoint", 0, "resampled"), ("equal", 2, "bonus")]:
        p, q = case(name, 2)
        for _ in range(500):
            draft = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(2)])
            v = verify_chain(p[:3], q[:2], draft, gen)
            assert (v.n_accepted, v.kind) == (n_expected, kind), name
            assert p[v.n_accepted, v.token] > 0


def test_verdict_fields():
    """The record the app animates: p(x), q(x), min(1, p/q), the u's, and the law of the final token."""
    p = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.2, 0.3, 0.5], [0.5, 0.5, 0.0]])
    draft = torch.tensor([1, 0])
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        v = verify_chain(p, q, draft, gen)
        torch.testing.assert_close(v.p_x, torch.tensor([0.6, 0.5]))
        torch.testing.assert_close(v.q_x, torch.tensor([0.3, 0.5]))
        torch.testing.assert_close(v.accept_prob, torch.tensor([1.0, 1.0]))
        assert v.k == 2 and v.n_accepted == 2 and v.kind == "bonus"   # both ratios are 1: never rejected
        torch.testing.assert_close(v.final_dist, p[2])
        seen.add(v.token)
    assert seen == {0, 1, 2}
    # the first draft is now over-proposed: accept with 0.6/0.9 = 2/3, else resample from the residual
    q = torch.tensor([[0.05, 0.9, 0.05], [0.5, 0.5, 0.0]])
    n_rej = 0
    for _ in range(200):
        v = verify_chain(p, q, draft, gen)
        torch.testing.assert_close(v.accept_prob[0], torch.tensor(2 / 3))
        if v.n_accepted == 0:
            n_rej += 1
            assert v.kind == "resampled" and v.token != 1 and v.u[0] >= v.accept_prob[0]
            torch.testing.assert_close(v.final_dist, residual(p[0], q[0]))
            torch.testing.assert_close(v.final_dist, torch.tensor([0.05, 0.0, 0.25]) / 0.3)
    assert 30 < n_rej < 110   # 200/3 expected


def test_one_hot_and_residual():
    assert one_hot(torch.tensor([2, 0]), 4).tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    torch.testing.assert_close(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual(p, p.clone()), p)  # empty residual: the documented fallback
