"""Drawing a tree step (StepRecord.tree): the candidate tree, its attention mask, and the verify walk.

Miao et al., "SpecInfer" (ASPLOS 2024), tree attention and multi-step speculative sampling; Cai et al.,
"Medusa" (2024), sec. 2.1.2. The tree is drawn left to right, one column per drafted position; siblings stack
in rank order (the drafter's first choice on top, tried first), so each first-choice chain runs straight.
Through the verify frames the tested children light up in the order the rule tested them (accepted green,
rejected red, the one being tested outlined), branches that can no longer be reached fade, and the result
frame adds the resampled or bonus token after the accepted path. Colours are view.py's.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from specdec_core.records import StepRecord, TreeNode, TreeView

from .captions import count
from .frames import DRAFT, RESULT, VERIFY, Frame
from .view import BLUE, GREEN, GREY, ORANGE, P_COLOR, PURPLE, RED, bars, chip, gauge, glyphs, token_label

FADED = "#cfd8dc"
KIND = {"resampled": ("resampled", ORANGE), "bonus": ("bonus", BLUE)}


def layout(view: TreeView) -> dict[int, tuple[float, float]]:
    """node -> (x, y): x the depth; leaves take rows top-down in rank order, a parent its first child's row."""
    kids: dict[int, list[int]] = {}
    for n in view.nodes[1:]:
        kids.setdefault(n.parent, []).append(n.index)
    pos, row = {}, [0]

    def place(i: int) -> float:
        ys = [place(c) for c in sorted(kids.get(i, []), key=lambda c: view.nodes[c].rank)]
        if not ys:
            ys, row[0] = [-row[0]], row[0] + 1
        pos[i] = (float(view.nodes[i].depth), ys[0])
        return ys[0]

    place(0)
    return pos


def _line(view: TreeView, i: int) -> list[int]:
    """Node i and its ancestors up to (not including) the root."""
    out = []
    while i > 0:
        out.append(i)
        i = view.nodes[i].parent
    return out


def state(view: TreeView, f: Frame) -> dict[int, str]:
    """node -> "hidden" | "drafted" | "testing" | "accepted" | "rejected" | "pruned" at frame f (root excluded).
    Pruned: unreachable now, because an ancestor was rejected or a sibling of it (or of the node) accepted."""
    seen = {n.index: n.trial for n in view.tried()[:f.checked]} if f.phase != DRAFT else {}
    won = {view.nodes[i].parent: i for i, t in seen.items() if t.accepted}
    out = {}
    for n in view.nodes[1:]:
        if f.phase == DRAFT and n.depth > f.shown:
            out[n.index] = "hidden"
        elif n.index in seen:
            t = seen[n.index]
            last = f.phase == VERIFY and t.order == f.checked - 1
            out[n.index] = "testing" if last else ("accepted" if t.accepted else "rejected")
        elif any((a in seen and not seen[a].accepted) or won.get(view.nodes[a].parent, a) != a
                 for a in _line(view, n.index)) or f.phase == RESULT:
            out[n.index] = "pruned"
        else:
            out[n.index] = "drafted"
    return out


COLOR = {"drafted": PURPLE, "accepted": GREEN, "rejected": RED, "pruned": FADED, "hidden": FADED}


def _hover(n: TreeNode) -> str:
    conf = (f"drafter's own probability {n.conf:.3f}" if n.conf is not None
            else "no draft probability (copied from the context, or a drafter without one)")
    head = f"node {n.index} “{glyphs(n.piece)}” · depth {n.depth}, choice #{n.rank + 1} of its parent · {conf}"
    if n.trial is None:
        return head + "<br>not tried"
    t = n.trial
    return (head + f"<br>trial {t.order + 1}: p(x) = {t.p:.3f}, q(x) = {t.q:.3f}, min(1, p/q) = {t.accept_prob:.3f},"
            f" u = {t.u:.3f} → {'accepted' if t.accepted else 'rejected'}")


def tree_figure(rec: StepRecord, f: Frame) -> go.Figure:
    """The candidate tree at frame f: one marker per drafted candidate (trace "candidates"), the root (the
    pending token), edges, the drafter's probability under each node, and on the result frame the token the
    step drew after the accepted path."""
    view = rec.tree
    pos, st = layout(view), state(view, f)
    fig = go.Figure()
    for style, color, width in (("faded", FADED, 1.5), ("live", "#90a4ae", 2), ("path", GREEN, 4)):
        xs, ys = [], []
        for n in view.nodes[1:]:
            s = st[n.index]
            kind = "path" if s == "accepted" else "faded" if s in ("pruned", "hidden", "rejected") else "live"
            if kind == style and s != "hidden":
                (x0, y0), (x1, y1) = pos[n.parent], pos[n.index]
                xs += [x0, x1, None]
                ys += [y0, y1, None]
        fig.add_scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=width), hoverinfo="skip",
                        showlegend=False)
    fig.add_scatter(x=[0], y=[pos[0][1]], mode="markers+text", name="root", text=[token_label(view.nodes[0].piece)],
                    textposition="top center", marker=dict(size=18, color=GREY, symbol="square"),
                    hovertext=[f"root: the pending token “{glyphs(view.nodes[0].piece)}”, already committed"],
                    hoverinfo="text", showlegend=False)
    cand = view.nodes[1:]
    vis = [st[n.index] != "hidden" for n in cand]
    fig.add_scatter(
        x=[pos[n.index][0] for n in cand], y=[pos[n.index][1] for n in cand], mode="markers+text", name="candidates",
        text=[token_label(n.piece) if v else "" for n, v in zip(cand, vis)], textposition="top center",
        textfont=dict(size=14), hovertext=[_hover(n) for n in cand], hoverinfo="text", showlegend=False,
        marker=dict(size=[24 if st[n.index] == "testing" else 18 for n in cand],
                    color=[COLOR.get(st[n.index], RED if n.trial and not n.trial.accepted else GREEN)
                           if st[n.index] != "testing" else ("#a5d6a7" if n.trial.accepted else "#ffcdd2")
                           for n in cand],
                    opacity=[0.0 if not v else 0.45 if st[n.index] == "pruned" else 1.0 for n, v in zip(cand, vis)],
                    line=dict(color=[P_COLOR if st[n.index] == "testing" else "white" for n in cand], width=2)))
    fig.add_scatter(x=[pos[n.index][0] for n, v in zip(cand, vis) if v],
                    y=[pos[n.index][1] - 0.32 for n, v in zip(cand, vis) if v], mode="text", hoverinfo="skip",
                    text=[f"{n.conf:.2f}" if n.conf is not None else "" for n, v in zip(cand, vis) if v],
                    textfont=dict(size=11, color=GREY), showlegend=False)
    if f.phase == RESULT and rec.committed and rec.committed[-1].origin == rec.final_kind:
        last = view.path[-1] if view.path else 0
        word, color = KIND.get(rec.final_kind, ("drawn", GREY))
        x, y = pos[last]
        fig.add_scatter(x=[x, x + 1], y=[y, y], mode="lines", line=dict(color=color, width=3, dash="dot"),
                        hoverinfo="skip", showlegend=False)
        fig.add_scatter(x=[x + 1], y=[y], mode="markers+text", name=word, text=[token_label(rec.final_piece)],
                        textposition="top center", marker=dict(size=20, color=color, symbol="diamond"),
                        hovertext=[f"{word}: drawn by the target, probability {rec.committed[-1].p:.3f}"],
                        hoverinfo="text", showlegend=False)
    rows = 1 - min(y for _, y in pos.values())
    fig.update_layout(height=140 + 62 * rows, margin=dict(l=10, r=10, t=36, b=10), font=dict(size=13),
                      title=dict(text=f"The candidate tree: {count(view.drafted, 'candidate')}, {view.depth} deep",
                                 font=dict(size=15)),
                      xaxis=dict(title="drafted position", dtick=1, range=[-0.4, view.depth + 1.4],
                                 zeroline=False),
                      yaxis=dict(visible=False, range=[-rows + 0.4, 0.6]), plot_bgcolor="white")
    return fig


def mask_figure(view: TreeView, lit: bool = False) -> go.Figure:
    """The tree attention mask as a heatmap: row i is the node being scored, a filled cell j a node it sees
    (itself and its ancestors; every node also sees the whole committed context). With `lit` (once the verdict
    is out), cells where both nodes are on the accepted path are green."""
    on = {n.index for n in view.nodes if n.on_path} if lit else set()
    z = [[(2 if i in on and j in on else 1) if see else 0 for j, see in enumerate(row)]
         for i, row in enumerate(view.mask)]
    names = [f"{n.index} {token_label(n.piece)}" for n in view.nodes]
    fig = go.Figure(go.Heatmap(z=z, x=names, y=names, zmin=0, zmax=2, showscale=False, xgap=1, ygap=1,
                               colorscale=[[0, "#fafafa"], [0.5, "#ce93d8"], [1, "#81c784"]],
                               hovertemplate="row %{y} sees %{x}: %{z}<extra></extra>"))
    fig.update_layout(height=160 + 22 * len(names), margin=dict(l=10, r=10, t=36, b=10), font=dict(size=12),
                      title=dict(text="Tree attention: each row sees only its own branch", font=dict(size=15)),
                      yaxis=dict(autorange="reversed", type="category"), xaxis=dict(type="category", tickangle=-60))
    return fig


def against(rec: StepRecord, n: TreeNode):
    """(what the trial of node n was tested against, as a label, its top list): p(. | parent) for the first
    child tried at a node (the chain view's position at that depth holds it), else the residual the previous
    sibling's rejection left."""
    prev = [m for m in rec.tree.tried() if m.parent == n.parent and m.trial.order < n.trial.order]
    if prev:
        return f"residual after rejecting “{token_label(prev[-1].piece)}”", prev[-1].trial.residual
    parent = rec.tree.nodes[n.parent]
    top = rec.positions[n.depth - 1].p_top if n.depth - 1 < len(rec.positions) else []
    return f"p(· | “{token_label(parent.piece)}”)", top


def trial_figure(rec: StepRecord, f: Frame) -> go.Figure:
    """The trial being shown: the distribution it was tested against, and after a rejection the residual the
    next sibling (or the final draw) gets."""
    n = rec.tree.tried()[f.checked - 1]
    what, top = against(rec, n)
    series = [(what, top, P_COLOR)]
    if not n.trial.accepted and n.trial.residual:
        series.append(("residual after this rejection", n.trial.residual, ORANGE))
    return bars(series, n.token, f"Trial {n.trial.order + 1}: “{token_label(n.piece)}” against {what}")


def trial_table(rec: StepRecord, f: Frame, greedy: bool) -> str:
    """Every child tested so far, in the order tested, then the candidates never tried."""
    rows, tried = [], rec.tree.tried()
    for n in tried[:f.checked]:
        t, parent = n.trial, rec.tree.nodes[n.parent]
        verdict = "accepted" if t.accepted else "rejected"
        prev = [m for m in tried if m.parent == n.parent and m.trial.order < t.order]
        vs = "p" if not prev else f"residual ({len(prev)} removed)"
        rows.append(f'<tr class="vrow vrow-{verdict} trow"><td>{t.order + 1}</td>'
                    f'<td>{chip(n.piece, "tok-" + verdict, token=n.token)}</td>'
                    f'<td>after “{html.escape(token_label(parent.piece))}”, choice #{n.rank + 1}</td><td>{vs}</td>'
                    f'<td>{t.p:.3f}</td><td>{t.q:.3f}</td><td><b>{t.accept_prob:.3f}</b></td>'
                    f'<td style="width:28%">{gauge(t.accept_prob, None if greedy else t.u)}</td>'
                    f'<td class="verdict-{verdict}">{"✓" if t.accepted else "✗"} {verdict}</td></tr>')
    if f.phase == RESULT:
        left = [n for n in rec.tree.nodes[1:] if n.trial is None]
        if left:
            rows.append(f'<tr class="vrow"><td></td><td colspan="8" class="verdict-unchecked leftover">never tried '
                        f'(their branch was cut): {count(len(left), "candidate")}, '
                        + " ".join(chip(n.piece, "tok-unchecked", token=n.token) for n in left[:12])
                        + (" …" if len(left) > 12 else "") + "</td></tr>")
    header = ("<tr><th>trial</th><th>candidate</th><th>branch</th><th>tested against</th><th>p(x)</th>"
              "<th>q(x)</th><th>min(1, p/q)</th><th>" + ("keep if it is the target's top token" if greedy else
                                                          "keep if u falls in the green part") +
              "</th><th>verdict</th></tr>")
    return f'<table class="vtable ttable">{header}{"".join(rows)}</table>'
