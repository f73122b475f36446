"""Drawing StepRecords: token chips (HTML spans with hover text), the verification table, the acceptance
gauge, the legend, and plotly bar charts of p, q and the residual norm(max(0, p - q)).

Colours are fixed across the app so a classroom learns them once: accepted green, rejected red,
resampled orange, bonus blue, plain target grey, a draft not yet checked purple and dashed.
CSS classes (tok-accepted, tok-rejected, ...) double as stable hooks for the browser test.
"""
from __future__ import annotations

import html
import re

import plotly.graph_objects as go

from specdec_core import pieces
from specdec_core.records import DRAFTED, Candidate, Position, StepRecord

from .frames import DRAFT, RESULT, VERIFY, Frame

GREEN, RED, ORANGE, BLUE, GREY, PURPLE = "#2e7d32", "#c62828", "#ef6c00", "#1565c0", "#546e7a", "#7b1fa2"
P_COLOR, Q_COLOR = "#263238", "#ab47bc"

# committed origin -> CSS class
ORIGIN_CLASS = {"draft": "tok-accepted", "resampled": "tok-resampled", "bonus": "tok-bonus",
                "target": "tok-target"}
ORIGIN_WORDS = {"draft": "accepted draft", "resampled": "resampled after a rejection",
                "bonus": "bonus token (all drafts accepted)", "target": "plain decoding by the target"}

CSS = """
<style>
.tok { display:inline-block; white-space:pre; font-family:ui-monospace,Menlo,Consolas,monospace;
       font-size:1.05rem; line-height:1.5; padding:0 3px; margin:2px 1px; border-radius:5px;
       border:2px solid transparent; }
.tok-accepted  { background:#c8e6c9; border-color:#2e7d32; color:#1b5e20; }
.tok-rejected  { background:#ffcdd2; border-color:#c62828; color:#b71c1c; text-decoration:line-through; }
.tok-resampled { background:#ffe0b2; border-color:#ef6c00; color:#e65100; font-weight:600; }
.tok-bonus     { background:#bbdefb; border-color:#1565c0; color:#0d47a1; font-weight:600; }
.tok-target    { background:#eceff1; border-color:#90a4ae; color:#263238; }
.tok-draft     { background:#f3e5f5; border:2px dashed #7b1fa2; color:#4a148c; }
.tok-unchecked { background:#f5f5f5; border:2px dashed #bdbdbd; color:#9e9e9e; text-decoration:line-through; }
.tok-template  { font-size:0.8rem; font-style:italic; opacity:0.7; }   /* keeps its verdict's colours */
.tok-context   { color:#78909c; font-family:ui-monospace,Menlo,Consolas,monospace; white-space:pre-wrap; }
.strip { padding:10px 12px; border:1px solid #e0e0e0; border-radius:10px; background:#fafafa;
         line-height:2.0; }
.strip-label { font-size:0.8rem; color:#607d8b; text-transform:uppercase; letter-spacing:0.05em;
               margin-bottom:4px; }
.legend span.tok { margin-right:10px; }
.phases { display:flex; gap:8px; margin:4px 0 8px 0; }
.phase { padding:4px 14px; border-radius:16px; background:#eceff1; color:#78909c; font-weight:600; }
.phase-on { background:#263238; color:white; }
.vtable { width:100%; border-collapse:collapse; font-size:1.0rem; }
.vtable th { text-align:left; color:#607d8b; font-weight:600; font-size:0.85rem; padding:4px 6px;
             border-bottom:1px solid #e0e0e0; }
.vtable td { padding:6px 6px; border-bottom:1px solid #f0f0f0; vertical-align:middle; }
.gauge { position:relative; height:22px; width:100%; min-width:160px; background:#ffcdd2;
         border-radius:4px; overflow:visible; }
.gauge-keep { position:absolute; left:0; top:0; bottom:0; background:#a5d6a7; border-radius:4px 0 0 4px; }
.gauge-u { position:absolute; top:-4px; bottom:-4px; width:3px; background:#000; }
.gauge-ulabel { position:absolute; top:-1px; font-size:0.75rem; font-weight:700; padding-left:5px; }
.verdict-accepted { color:#2e7d32; font-weight:700; white-space:nowrap; }
.verdict-rejected { color:#c62828; font-weight:700; white-space:nowrap; }
.verdict-unchecked { color:#9e9e9e; white-space:nowrap; }
.vtable td.leftover { white-space:normal; }   /* the untried candidates wrap, never widen the table */
.bigcap { font-size:1.15rem; line-height:1.55; }
/* Play and Pause share one button: one width for both, so the replay bar does not shift under a click */
.st-key-play button { min-width:7.5rem; }
</style>
"""


# whitespace and invisible characters -> a glyph a class can see (control characters: Unicode's pictures)
GLYPHS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "\x7f": "␡", "\u00a0": "⍽", "\u200b": "⟨ZWSP⟩",
          "\u200c": "⟨ZWNJ⟩", "\u200d": "⟨ZWJ⟩", "\ufeff": "⟨BOM⟩", "\u2028": "⟨LS⟩", "\u2029": "⟨PS⟩"}
GLYPHS.update({chr(c): chr(0x2400 + c) for c in range(0x20) if chr(c) not in GLYPHS})
TEMPLATE = re.compile(r"<\|[^<>|\s]{1,40}\|>|</?s>")   # chat-template / special tokens: <|im_end|>, </s>


def glyphs(piece: str, spaces: bool = True) -> str:
    """Every whitespace and control character as a visible glyph (spaces too, unless `spaces` is False); the bytes
    of a lone fragment of a character as ⟨F0 9F⟩ (pieces.readable), never "�"."""
    shown = "".join(GLYPHS.get(ch, ch) if spaces or ch != " " else ch for ch in piece)
    return pieces.readable(shown) or "∅"    # after the glyphs: the bytes' own spacing is not a space token


def show(piece: str) -> str:
    """One token quoted in prose or a label: every character visible, HTML-safe (a space is ␣)."""
    return html.escape(glyphs(piece), quote=False)


def is_template(piece: str) -> bool:
    return bool(TEMPLATE.fullmatch(piece.strip()))


def chip_body(piece: str) -> str:
    """A chip's text: a token of only whitespace/control characters shows them all as glyphs (an empty box
    says nothing); inside a word, spaces stay spaces (the chip's edges show where they are)."""
    blank = not piece.strip() or any(ord(ch) < 0x20 or ch in GLYPHS for ch in piece if ch not in " \n\t")
    return html.escape(glyphs(piece, spaces=blank), quote=False)


def chip(piece: str, cls: str, title: str = "", extra: str = "", token: int | None = None) -> str:
    """A token chip; hover shows the raw id and text. Chat-template tokens become one muted 'template' chip that
    keeps its verdict's class and colours."""
    raw = f"id {token} · {pieces.readable(piece)!r}" if token is not None else ""
    title = " · ".join(x for x in (title, raw) if x)
    t = f' title="{html.escape(title, quote=True)}"' if title else ""
    if is_template(piece):
        name = piece.strip().strip("<>|/") or "special"
        return f'<span class="tok tok-template {cls}"{t}{extra}>template: {html.escape(name)}</span>'
    return f'<span class="tok {cls}"{t}{extra}>{chip_body(piece)}</span>'


def template_text(text: str) -> str:
    """Prompt text as HTML: chat-template markers (`<|im_start|>assistant`) as muted chips, the rest escaped
    with newlines kept (the context is prose, not tokens)."""
    out, at = [], 0
    for m in re.finditer(r"(<\|[^<>|\s]{1,40}\|>)([a-z]{2,12}\n)?", text):
        out.append(html.escape(text[at:m.start()]))
        name = (m.group(2) or "").strip() or m.group(1).strip("<>|")
        out.append(f'<span class="tok tok-template" title="{html.escape(m.group(0), quote=True)}">'
                   f'template: {html.escape(name)}</span>')
        at = m.end()
    return "".join(out) + html.escape(text[at:])


def _find(top: list[Candidate], token: int) -> float | None:
    for c in top:
        if c.id == token:
            return c.prob
    return None


def position_title(pos: Position, i: int) -> str:
    return (f"draft #{i + 1} “{glyphs(pos.piece)}”: p(x) = {pos.p:.3f}, q(x) = {pos.q:.3f}, "
            f"min(1, p/q) = {pos.accept_prob:.3f}, u = {pos.u:.3f} -> {pos.verdict}")


def committed_chips(rec: StepRecord) -> list[tuple[str, str, str, int]]:
    """(piece, css class, hover text, id) for each token the step committed."""
    out = []
    for j, c in enumerate(rec.committed):
        title = f"{ORIGIN_WORDS.get(c.origin, c.origin)} (step {rec.index + 1})"
        if c.origin == DRAFTED and j < len(rec.positions):
            pos = rec.positions[j]
            title += f": p(x) = {pos.p:.3f}, q(x) = {pos.q:.3f}, u = {pos.u:.3f} < min(1, p/q) = {pos.accept_prob:.3f}"
        elif c.origin == "resampled":
            pt = rec.positions[rec.n_accepted].p_top if rec.n_accepted < len(rec.positions) else []
            p = _find(pt, c.token)
            title += f": drawn from norm(max(0, p - q)) with probability {c.p:.3f}"
            title += f"; target p(x) = {p:.3f}" if p is not None else ""
        else:
            title += f": p(x) = {c.p:.3f}"
        out.append((c.piece, ORIGIN_CLASS.get(c.origin, "tok-target"), title, c.token))
    return out


def merged(chips: list[tuple[str, str, str, int]], mixed: bool = True) -> list[str]:
    """Chips as HTML, a character split over several tokens (an emoji is often three) shown once, in one chip
    with the colour of its first token and every token's id and origin on hover. Unless `mixed`, tokens of
    different verdicts stay apart (each fragment shown as its bytes)."""
    out = []
    for a, b, text in pieces.groups([c[0] for c in chips]):
        if b - a == 1 or (not mixed and len({c[1] for c in chips[a:b]}) > 1):
            out += [chip(*c[:3], token=c[3]) for c in chips[a:b]]
            continue
        if b - a == 1:
            out.append(chip(*chips[a][:3], token=chips[a][3]))
            continue
        part = chips[a:b]
        title = (f"one character over {b - a} tokens (ids {', '.join(str(c[3]) for c in part)}): "
                 + " + ".join(c[2] for c in part))
        out.append(chip(text, part[0][1], title))
    return out


def _flow(chips: list[tuple[str, str, str, int]]) -> str:
    """Chips as running text: a line break after each newline token."""
    return "".join(h + ("<br>" if "\n" in p else "") for h, p in zip(merged(chips), _texts(chips)))


def _texts(chips) -> list[str]:
    return [text for _, _, text in pieces.groups([c[0] for c in chips])]


def text_so_far(records: list[StepRecord], upto: int, include_last: bool = True, limit: int = 0) -> str:
    """The generated text as coloured chips: steps before `upto`, and step `upto` itself if include_last."""
    chips = []
    for r in records[:upto + (1 if include_last else 0)]:
        chips += committed_chips(r)
    cut = limit and len(chips) > limit
    body = ('<span class="tok-context">… </span>' if cut else "") + _flow(chips[-limit:] if cut else chips)
    return f'<div class="strip text-so-far">{body or "<i>nothing generated yet</i>"}</div>'


def context_strip(prompt: str, records: list[StepRecord], i: int, f: Frame, limit: int = 40) -> str:
    """The context the drafter sees (prompt tail + committed text) followed by this step's drafts."""
    rec = records[i]
    chips = [c for r in records[:i] for c in committed_chips(r)]
    if len(chips) < limit:
        tail = prompt[-max(40, 160 - 4 * len(chips)):]
        close, start = tail.find("|>"), tail.find("<|")
        if close != -1 and (start == -1 or close < start):   # never start inside a template marker
            tail = tail[close + 2:]
        lead = (f'<span class="tok-context">{"… " if len(tail) < len(prompt) else ""}{template_text(tail)} '
                '</span>')
    else:
        chips = chips[-limit:]
        lead = '<span class="tok-context">… </span>'
    body = lead + "".join(merged(chips))
    body += '<span style="display:inline-block;width:14px"></span>'
    drafts = []
    for j in range(f.shown):
        pos = rec.positions[j]
        if f.phase == DRAFT:
            cls, title = "tok-draft", f"draft #{j + 1}, q(x) = {pos.q:.3f}"
        elif j < f.checked:
            cls, title = f"tok-{pos.verdict}", position_title(pos, j)
        else:  # never checked (a rejection before it is already shown) or waiting for its turn
            gone = f.phase == RESULT or f.checked > rec.n_accepted
            cls, title = ("tok-unchecked" if gone else "tok-draft"), f"draft #{j + 1}"
        drafts.append((pos.piece, cls, title, pos.token))
    body += "".join(merged(drafts, mixed=False))
    if f.phase == RESULT and rec.committed and rec.committed[-1].origin == rec.final_kind:  # EOS may cut it
        cls = {"resampled": "tok-resampled", "bonus": "tok-bonus"}.get(rec.final_kind, "tok-target")
        p = rec.committed[-1].p if rec.committed else 0.0
        body += chip(rec.final_piece, cls, f"{ORIGIN_WORDS.get(rec.final_kind, rec.final_kind)}: probability {p:.3f}",
                     token=rec.final_token)
    return (f'<div class="strip-label">Context, then this step\'s drafted tokens</div>'
            f'<div class="strip context-strip">{body}</div>')


def gauge(accept: float, u: float | None) -> str:
    a = max(0.0, min(1.0, accept)) * 100
    g = f'<div class="gauge" title="keep if u < {accept:.3f}"><div class="gauge-keep" style="width:{a:.1f}%"></div>'
    if u is not None:
        x = max(0.0, min(1.0, u)) * 100
        left = f"{x:.1f}%" if x < 80 else f"calc({x:.1f}% - 62px)"
        g += (f'<div class="gauge-u" style="left:{x:.1f}%"></div>'
              f'<div class="gauge-ulabel" style="left:{left}">u={u:.2f}</div>')
    return g + "</div>"


def verify_table(rec: StepRecord, f: Frame, greedy: bool = False) -> str:
    """One row per drafted position whose verdict is visible; the rest listed as waiting or not checked. At
    temperature 0 no u is drawn (the rule keeps exactly the target's top token; a u would decide nothing)."""
    rows = []
    for j, pos in enumerate(rec.positions[:f.shown]):
        if j < f.checked:
            verdict = {"accepted": "✓ accepted", "rejected": "✗ rejected"}.get(pos.verdict, pos.verdict)
            rows.append(
                f'<tr class="vrow vrow-{pos.verdict}"><td>{j + 1}</td><td>{chip(pos.piece, "tok-" + pos.verdict, position_title(pos, j), token=pos.token)}</td>'
                f'<td>{pos.p:.3f}</td><td>{pos.q:.3f}</td><td><b>{pos.accept_prob:.3f}</b></td>'
                f'<td style="width:38%">{gauge(pos.accept_prob, None if greedy else pos.u)}</td>'
                f'<td class="verdict-{pos.verdict}">{verdict}</td></tr>')
        else:
            after = f.phase == RESULT or f.checked > rec.n_accepted
            label = "not checked" if after else "waiting"
            cls = "tok-unchecked" if after else "tok-draft"
            rows.append(f'<tr class="vrow"><td>{j + 1}</td><td>{chip(pos.piece, cls, token=pos.token)}</td><td></td><td></td>'
                        f'<td></td><td></td><td class="verdict-unchecked">{label}</td></tr>')
    keep = "keep if it is the target's top token (green)" if greedy else "keep if u falls in the green part"
    header = ("<tr><th>#</th><th>drafted</th><th>p(x) target</th><th>q(x) draft</th><th>min(1, p/q)</th>"
              f"<th>{keep}</th><th>verdict</th></tr>")
    return f'<table class="vtable">{header}{"".join(rows)}</table>'


def legend() -> str:
    items = [("accepted", "tok-accepted", "a drafted token the target kept"),
             ("rejected", "tok-rejected", "a drafted token the target threw away"),
             ("resampled", "tok-resampled", "drawn by the target instead of the rejected one"),
             ("bonus", "tok-bonus", "free extra token when every draft passed"),
             ("plain", "tok-target", "the target alone, no draft"),
             ("drafted", "tok-draft", "a guess not checked yet")]
    return '<div class="legend">' + "".join(chip(n, c, t) for n, c, t in items) + "</div>"


def phase_pills(f: Frame) -> str:
    names = [(DRAFT, "1 · Draft"), (VERIFY, "2 · Verify"), (RESULT, "3 · Result")]
    return '<div class="phases">' + "".join(
        f'<span class="phase {"phase-on" if f.phase == ph else ""}">{label}</span>' for ph, label in names) + "</div>"


def token_label(piece: str) -> str:
    """A token as a chart label: every character visible (a space is ␣), template tokens named."""
    return f"template: {piece.strip().strip('<>|/')}" if is_template(piece) else glyphs(piece)


def bars(series: list[tuple[str, list[Candidate], str]], highlight: int | None = None, title: str = "") -> go.Figure:
    """Horizontal bars for one or more top-k lists over the union of their tokens (most likely on top)."""
    ids: dict[int, str] = {}
    for _, top, _ in series:
        for c in top:
            ids.setdefault(c.id, c.piece)
    best = {i: max((_find(top, i) or 0.0) for _, top, _ in series) for i in ids}
    order = sorted(ids, key=lambda i: best[i])[-10:]
    labels = [("▶ " if i == highlight else "") + token_label(ids[i]) + f"  #{i}" for i in order]
    fig = go.Figure()
    for name, top, color in series:
        fig.add_bar(y=labels, x=[_find(top, i) or 0.0 for i in order], name=name, orientation="h",
                    marker_color=color, text=[f"{(_find(top, i) or 0):.2f}" for i in order],
                    textposition="outside", cliponaxis=False, textfont=dict(size=13))
    height = 110 + len(order) * (18 + 14 * len(series))
    fig.update_layout(title=dict(text=title, font=dict(size=16)), barmode="group", height=height,
                      uniformtext=dict(minsize=12, mode="show"), bargap=0.25,
                      margin=dict(l=10, r=30, t=40 if title else 10, b=10),
                      xaxis=dict(range=[0, 1.12], title=dict(text="probability", font=dict(size=13))),
                      legend=dict(orientation="h", yanchor="top", y=-0.06, x=0), font=dict(size=14))
    return fig


def pq_figure(pos: Position, j: int) -> go.Figure:
    q_top = pos.q_top or [Candidate(pos.token, pos.piece, 1.0)]  # a deterministic draft is a one-hot q
    return bars([("p: target", pos.p_top, P_COLOR), ("q: draft", q_top, Q_COLOR)], pos.token,
                f"Draft #{j + 1} “{token_label(pos.piece)}”: p(x) = {pos.p:.2f}, q(x) = {pos.q:.2f}")


def result_figure(rec: StepRecord) -> go.Figure:
    if rec.final_kind == "resampled":
        return bars([("norm(max(0, p − q))", rec.final_top, ORANGE)], rec.final_token,
                     f"Residual distribution: resampled “{token_label(rec.final_piece)}”")
    if rec.final_kind == "bonus":
        return bars([("p: target, next position", rec.final_top, BLUE)], rec.final_token,
                     f"Bonus from p: “{token_label(rec.final_piece)}”")
    return bars([("p: target", rec.final_top, P_COLOR)], rec.final_token,
                f"Target distribution: drew “{token_label(rec.final_piece)}”")
