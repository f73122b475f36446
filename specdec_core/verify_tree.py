"""Exact verification of a candidate tree: multi-candidate (recursive) rejection sampling.

Miao et al., "SpecInfer: Accelerating Generative LLM Serving with Tree-based Speculative Inference and
Verification" (ASPLOS 2024), multi-step speculative sampling; Jeon et al., "Recursive Speculative Decoding:
Accelerating LLM Inference via Sampling Without Replacement" (2024); Cai et al., "Medusa" (2024), whose
typical acceptance is lossy and is not used here.

The rule. Start at the root with r = p(. | root). Try the root's children x_1, x_2, ... in rank order. Child i
was drawn from q_i, the distribution it was actually drawn from given the siblings before it. Accept it with
probability min(1, r(x_i) / q_i(x_i)); on acceptance descend into it and start over with r = p(. | child).
On rejection replace r by norm(max(0, r - q_i)) and try the next sibling. When every child of the current node
is rejected, draw the token from the final r ("resampled"); at a leaf, draw it from p(. | leaf) ("bonus").

Why it is exact. Write M(r; x_1..x_m) for the procedure at one node with target r. Claim: if each x_i is
drawn from q_i given x_1..x_{i-1}, the token M stops on (accepted child or final draw) is distributed as r.
Induction on m. m = 0: the token is drawn from r. Step: for any y,
  P(out = y) = q_1(y) min(1, r(y)/q_1(y)) + sum_x q_1(x) (1 - min(1, r(x)/q_1(x))) P(M(r'; x_2..) = y | x_1 = x)
             = min(q_1, r)(y) + sum_x max(0, q_1(x) - r(x)) r'(y)
             = min(q_1, r)(y) + max(0, r(y) - q_1(y)) = r(y),
where r' = norm(max(0, r - q_1)) does not depend on x_1, so by induction M(r'; x_2..) outputs r' whatever x_1
was (the later siblings are drawn from their q_i given x_1, as the induction needs); and
sum_x max(0, q_1 - r) = sum_y max(0, r - q_1) because both q_1 and r sum to one. Having stopped on a child, the
same holds one level down with r = p(. | child), so the committed sequence is distributed as ancestral
sampling from p, i.e. plain decoding. The claim covers every way of drawing siblings:
  - i.i.d. from one q (SpecInfer): q_i = q for all i;
  - without replacement (recursive rejection sampling): q_i = q with x_1..x_{i-1} removed, renormalized;
  - deterministic ranked candidates (Medusa heads' top-k, prompt lookup): q_i = one_hot(x_i). Then the test
    is "accept x_i with probability r(x_i)" and the residual is r with x_i's mass removed, renormalized, so
    x_i is accepted with probability p(x_i) / (1 - p(x_1) - ... - p(x_{i-1})) — the chain rule of sampling from
    p by asking "is it x_1? else is it x_2? ...". The total probability of each x_i is p(x_i), of anything
    else p(y) via the final draw.
Greedy: p is one-hot at the argmax a; a child is accepted iff it is a, a rejection leaves r unchanged, and the
final draw is a. So greedy commits exactly the plain greedy tokens.

Pure: tensors in, verdict out, randomness only from the explicit generator (one uniform per node, drawn up
front, plus one categorical draw for the final token).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample
from .tree import Tree
from .verify import residual


@dataclass
class Trial:
    """One child tested against the current residual."""
    node: int
    p_x: float            # current target residual at the child's token
    q_x: float            # probability the child's token had under the distribution it was drawn from
    accept_prob: float    # min(1, p_x / q_x)
    u: float
    accepted: bool


@dataclass
class TreeVerdict:
    path: list[int]            # accepted node indices, root's child first (root excluded)
    token: int                 # the resampled or bonus token
    kind: str                  # "resampled" | "bonus"
    trials: list[Trial]        # every child tested, in order
    final_dist: torch.Tensor   # [V] what `token` was drawn from

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def without(r: torch.Tensor, x: int) -> torch.Tensor:
    """The residual [V] after a deterministic candidate x is rejected: norm(max(0, r - one_hot(x))), i.e. r with
    x's mass removed; r itself when x has none (every greedy rejection), without a pass over the vocabulary."""
    if float(r[x]) == 0.0:
        return r
    q = torch.zeros_like(r)
    q[x] = 1.0
    return residual(r, q)


def verify_tree(p: torch.Tensor, tokens: torch.Tensor, tree: Tree, gen: torch.Generator | None,
                q: torch.Tensor | None = None) -> TreeVerdict:
    """p: [T, V] target distribution after each node; tokens: [T] node ids (root's ignored);
    q: [T, V] the distribution each node's token was drawn from given its earlier siblings, None = one-hot
    (deterministic candidates). Returns the verdict."""
    T = tree.size
    assert p.shape[0] == T and tokens.shape[0] == T, (p.shape, tokens.shape, T)
    assert q is None or q.shape == p.shape, (None if q is None else q.shape, p.shape)
    u = torch.rand(T, generator=gen, device=p.device).tolist()   # u[j] is used only if node j is tested
    toks = tokens.tolist()
    path, trials, node = [], [], 0
    r = p[0]
    while True:
        kids = tree.children[node]
        for c in kids:
            x = toks[c]
            px = float(r[x])
            qx = 1.0 if q is None else float(q[c, x])
            a = min(1.0, px / qx) if qx > 0 else 0.0
            ok = u[c] < a
            trials.append(Trial(c, px, qx, a, u[c], ok))
            if ok:
                break
            r = without(r, x) if q is None else residual(r, q[c])
        else:
            kind = "resampled" if kids else "bonus"
            return TreeVerdict(path, int(sample(r, gen)), kind, trials, r)
        node = c
        path.append(c)
        r = p[c]
