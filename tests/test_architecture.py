"""The house plan holds: rooms import only downwards, no module circle (nor, inside specdec_core, one closed by an
import inside a function), no private name crosses a module, only the backend module tells the two model backends
apart, pages only lay out (no page over 250 lines, no plotly figure built in a page, no decoding loop driven from
a page), and docs/architecture.md's diagram is the import graph as it stands. `python tests/test_architecture.py` prints
the diagram's block from the code."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

# room -> the rooms it may import (itself included)
ALLOWED = {
    "decoding": {"decoding", "fast"},   # backend.py only (test_only_the_backend_opens_the_fast_path)
    "fast": {"fast", "decoding"},
    "training": {"training", "decoding", "bench"},
    "bench": {"bench", "decoding"},
    "serving": {"serving", "decoding", "bench"},   # peer and live-server figures use bench's measuring rule
    "cli": {"cli", "decoding", "training", "bench", "serving"},
    "app": {"app", "decoding", "bench", "serving"},
    "pages": {"app", "decoding", "bench", "serving"},
}


def modules() -> dict[str, Path]:
    out = {}
    for top in ("specdec_core", "app", "pages"):
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def room(mod: str) -> str:
    parts = mod.split(".")
    if parts[0] in ("app", "pages"):
        return parts[0]
    if len(parts) > 1 and parts[1] in ("training", "bench", "serving", "fast"):
        return parts[1]
    if mod in ("specdec_core.cli", "specdec_core.__main__"):
        return "cli"
    return "decoding"


def imports(mod: str, path: Path, known: set[str]):
    """-> [(imported module, names taken from it, at module level?)] for the project's own modules."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            sub = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            if sub:   # `from . import tree_step`: the submodules themselves
                out += [(s, [], id(node) in top_level) for s in sub]
                names = [n for n in names if f"{target}.{n}" not in known]
            if target in known and (names or not sub):
                out.append((target, names, id(node) in top_level))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], id(node) in top_level) for a in node.names if a.name in known]
    return out


def graph():
    mods = modules()
    known = set(mods)
    return mods, {m: imports(m, p, known) for m, p in mods.items()}


def room_edges() -> set[tuple[str, str]]:
    _, g = graph()
    return {(room(a), room(b)) for a, deps in g.items() for b, _, _ in deps if room(a) != room(b)}


def mermaid() -> str:
    lines = ["flowchart TD"] + [f"  {a} --> {b}" for a, b in sorted(room_edges())]
    return "\n".join(lines)


def test_rooms_import_only_downwards():
    _, g = graph()
    bad = [(a, b) for a, deps in g.items() for b, _, _ in deps if room(b) not in ALLOWED[room(a)]]
    assert not bad, f"imports against the house plan: {bad}"


DOOR = "specdec_core.backend"


def test_only_the_backend_opens_the_fast_path():
    """The lesson's code reads without the fast path: no module outside specdec_core/fast imports it, but backend.py,
    the one door (which hands out the fast versions and runs the reference with SPECDEC_FAST=0)."""
    _, g = graph()
    bad = sorted({(a, b) for a, deps in g.items() for b, _, _ in deps
                  if room(b) == "fast" and room(a) != "fast" and a != DOOR})
    assert not bad, f"the fast path opened outside backend.py: {bad}"
    assert any(room(b) == "fast" for b, _, _ in g[DOOR])   # the door is where the fast path is chosen


def test_the_fast_path_check_sees_an_import():
    known = {"specdec_core.sampling", "specdec_core.fast.packed", "specdec_core.fast"}
    src = "from .fast.packed import native_op\n"
    path = ROOT / "runs" / "_probe_sampling.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(src)
    try:
        got = imports("specdec_core.sampling", path, known)
    finally:
        path.unlink()
    assert [(b, room(b)) for b, _, _ in got] == [("specdec_core.fast.packed", "fast")]


def test_engine_imports_no_streamlit():
    mods, _ = graph()
    bad = [m for m, p in mods.items() if m.startswith("specdec_core")
           and re.search(r"^\s*(import|from)\s+streamlit", p.read_text(), re.M)]
    assert not bad, bad


def test_no_module_circle():
    """Module-level imports form no cycle (a package's lazy imports inside functions do not count)."""
    _, g = graph()
    edges = {a: {b for b, _, top in deps if top and b != a} for a, deps in g.items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in edges.get(m, ()):
            if state.get(n) == 1:
                raise AssertionError(f"import circle: {' -> '.join(stack[stack.index(n):] + [n])}")
            if not state.get(n):
                visit(n, stack + [n])
        state[m] = 2

    for m in edges:
        if not state.get(m):
            visit(m, [m])


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle in `edges` (module -> the modules it imports), as the path round it; None if none."""
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if not state.get(n) and (found := visit(n, stack + [n])):
                return found
        state[m] = 2
        return None

    for m in sorted(edges):
        if not state.get(m) and (found := visit(m, [m])):
            return found
    return None


def core_edges(g) -> dict[str, set[str]]:
    """specdec_core's imports, those inside functions included: a lazy import still ties the two modules together
    (neither can be read, moved or tested without the other). A package building its own submodules on demand
    (`drafters.make` importing `drafters.eagle` inside a function) is the one exception: those submodules take the
    package's protocol, and the package is their factory, not a client."""
    return {a: {b for b, _, top in deps if b != a and b.startswith("specdec_core")
                and (top or not (b.startswith(a + ".") and ROOT.joinpath(*a.split("."), "__init__.py").exists()))}
            for a, deps in g.items() if a.startswith("specdec_core")}


def test_no_import_circle_inside_the_engine():
    """No circle through specdec_core's modules, counting imports inside functions (drafters/distilled.py and
    drafters/registry.py once imported each other that way)."""
    _, g = graph()
    found = circle(core_edges(g))
    assert found is None, f"import circle: {' -> '.join(found)}"


def test_the_circle_check_sees_a_lazy_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    # a lazy import closing a circle counts; a package's lazy import of its own submodule does not
    g = {"specdec_core.drafters.registry": [("specdec_core.drafters.distilled", ["shipped_draft"], False)],
         "specdec_core.drafters.distilled": [("specdec_core.drafters.registry", ["load_weights"], True)],
         "specdec_core.drafters": [("specdec_core.drafters.eagle", ["Eagle"], False)],
         "specdec_core.drafters.eagle": [("specdec_core.drafters", ["Drafter"], True)]}
    assert circle(core_edges(g)) == ["specdec_core.drafters.distilled", "specdec_core.drafters.registry",
                                     "specdec_core.drafters.distilled"]


# -- pages lay out (README, Layout: "pages/ one file per page, layout only") ----------------------------------------

PAGE_LINES = 250
PAGES = sorted((ROOT / "pages").glob("*.py"))
# the decoding loops and the experiments' inner loops: a page asks bench/ or serving/ for the experiment instead
LOOPS = {"specdec_core.engine": {"decode", "run", "stream"}, "specdec_core.batch": {"decode_batch", "run_batch", "stream"},
         "specdec_core.step": {"step", "prefill"}, "specdec_core.serving.peer": {"measure", "llama_decode"}}
FIGURE_CALLS = {"Figure", "make_subplots", "add_trace", "add_bar", "add_scatter", "add_hline", "add_vline",
                "add_annotation", "add_shape", "update_layout", "update_xaxes", "update_yaxes", "update_traces"}


def names_used(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every name a module uses, its imports resolved: after `from specdec_core import
    engine`, `engine.run` is specdec_core.engine.run; after `from specdec_core.engine import run as r`, `r` is."""
    tree = ast.parse(source)
    alias = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            alias |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            alias |= {a.asname: a.name for a in node.names if a.asname}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) or (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
            parts, n = [], node
            while isinstance(n, ast.Attribute):
                parts.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name):
                parts.append(n.id)
                parts.reverse()
                out.append((node.lineno, ".".join([alias.get(parts[0], parts[0])] + parts[1:])))
    return sorted(set(out))


def loop_calls(source: str) -> list[str]:
    return [f"line {line}: {name}" for line, name in names_used(source)
            if "." in name and name.rsplit(".", 1)[1] in LOOPS.get(name.rsplit(".", 1)[0], ())]


def figure_building(source: str) -> list[str]:
    """Where `source` builds a plotly figure: imports plotly, or calls a figure's constructor or builder methods."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "plotly" for a in node.names):
            out.append(f"line {node.lineno}: import plotly")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "plotly":
            out.append(f"line {node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in FIGURE_CALLS:
                out.append(f"line {node.lineno}: {ast.unparse(f)}(...)")
    return sorted(out, key=lambda h: int(h.split(":")[0].split()[1]))


def test_no_page_is_over_250_lines():
    long = {p.name: n for p in PAGES if (n := len(p.read_text().splitlines())) > PAGE_LINES}
    assert not long, f"pages over {PAGE_LINES} lines (move what is not layout to app/ or specdec_core/): {long}"


def test_pages_build_no_figure():
    """Every chart is built in app/ (a function per chart); a page only hands it rows and shows it."""
    bad = {p.name: hits for p in PAGES if (hits := figure_building(p.read_text()))}
    assert not bad, f"plotly figures built in pages (build them in app/): {bad}"


def test_pages_drive_no_decoding_loop():
    """A page asks specdec_core.bench or serving for an experiment; it never decodes in a loop of its own."""
    bad = {p.name: hits for p in PAGES if (hits := loop_calls(p.read_text()))}
    assert not bad, f"pages calling a decoding loop (move the experiment to bench/ or serving/): {bad}"


def test_the_page_checks_see_each_form():
    src = ("from specdec_core import engine\nfrom specdec_core.batch import run_batch as rb\n"
           "import specdec_core.serving.peer as peer\nimport specdec_core.step\n"
           "engine.run(a, b)\nx = rb\npeer.measure(t)\nspecdec_core.step.step(r)\n"
           "engine.warm(t)\nmeasure.measure(k)\nrun(x)\n")
    assert [h.split(":")[0] for h in loop_calls(src)] == ["line 5", "line 6", "line 7", "line 8"]
    src = ("import plotly.graph_objects as go\nfrom plotly.subplots import make_subplots\nfig = go.Figure()\n"
           "fig.add_bar(x=[1])\nst.plotly_chart(charts.figure(rows))\n")
    assert [h.split(":")[0] for h in figure_building(src)] == ["line 1", "line 2", "line 3", "line 4"]


def test_no_private_name_crosses_a_module():
    _, g = graph()
    bad = [(a, b, n) for a, deps in g.items() for b, names, _ in deps for n in names
           if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


SEAM = {"specdec_core.backend"}   # the one module that knows our forward from transformers'


def backend_probes(source: str) -> list[str]:
    """Where `source` tells the backends apart by hand: `isinstance(x, <a cache type>)`, or comparing an
    LM's `.fwd` (our forward, or None for transformers') with None."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
            types = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            names = [getattr(t, "attr", getattr(t, "id", "")) for t in types]
            if any("Cache" in n for n in names):
                out.append(f"line {node.lineno}: isinstance(..., {', '.join(names)})")
        elif isinstance(node, ast.Compare) and all(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops):
            sides = [node.left] + node.comparators
            if any(isinstance(x, ast.Attribute) and x.attr == "fwd" for x in sides) and \
                    any(isinstance(x, ast.Constant) and x.value is None for x in sides):
                out.append(f"line {node.lineno}: .fwd compared with None")
    return out


def test_backend_probes_are_seen():
    """The scan finds what it looks for (each way of writing it), and not the forward's own use."""
    src = ("if isinstance(c, KVCache): pass\nif isinstance(c, (list, fw.KVCache)): pass\n"
           "if lm.fwd is None: pass\nx = 1 if t.fwd is not None else 2\nif None is lm.fwd: pass\n")
    assert len(backend_probes(src)) == 5
    assert backend_probes("lm.fwd(ids)\nif isinstance(x, list): pass\nif lm.fallback is None: pass\n") == []


def test_only_the_backend_tells_the_backends_apart():
    """No module but backend.py branches on which forward runs (isinstance of a cache type, `.fwd is None`):
    the decoders ask the backend (`lm.backend`, `backend.of`) instead."""
    mods, _ = graph()
    bad = {m: hits for m, p in mods.items() if m not in SEAM and (hits := backend_probes(p.read_text()))}
    assert not bad, f"backend checks outside {sorted(SEAM)}: {bad}"


def _strings(node) -> list[str]:
    """The string literals a comparison operand spells out: a constant, or a literal tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def name_comparisons(source: str, names) -> list[tuple[int, str]]:
    """(line, code) of every comparison of something against a drafter name spelled as a string: `x == "none"`,
    `"eagle" != x`, `x in ("draft", "early-exit")` (and their negations)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left] + node.comparators
        for op, a, b in zip(node.ops, sides, sides[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
                lits = [x for side in (a, b) if isinstance(side, ast.Constant) for x in _strings(side)]
            elif isinstance(op, (ast.In, ast.NotIn)) and not isinstance(b, ast.Constant):
                lits = _strings(b)
            else:
                lits = []
            if set(lits) & set(names):
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_no_drafter_name_is_compared_as_a_string_outside_drafters():
    """What a drafter is (drafts at all, needs a draft model, reports q, reads hidden states, has weights for
    a target) is asked of the registry (drafters/registry.py), never decided by spelling its name."""
    from specdec_core.drafters import NAMES
    mods, _ = graph()
    bad = [f"{p.relative_to(ROOT)}:{line}: {code}" for m, p in mods.items()
           if not m.startswith("specdec_core.drafters") for line, code in name_comparisons(p.read_text(), NAMES)]
    assert not bad, "drafter names compared as strings (ask specdec_core.drafters.entry(name)):\n" + "\n".join(bad)


def test_the_name_check_sees_each_form():
    names = ("none", "draft")
    src = ('a = s.drafter == "none"\nb = "draft" != s.drafter\nc = n in ("draft", "x")\nd = n not in ["none"]\n'
           'e = k == "other"\nf = "none" in text\ng = n in NAMES\n')
    assert [line for line, _ in name_comparisons(src, names)] == [1, 2, 3, 4]


def test_the_diagram_is_the_code():
    block = re.search(r"```mermaid\n(.*?)\n```", DOC.read_text(), re.S)
    assert block, f"{DOC.name} has no mermaid block"
    assert block.group(1).strip() == mermaid(), \
        f"{DOC.name}'s diagram is stale; `python tests/test_architecture.py` prints the current one"


if __name__ == "__main__":
    sys.stdout.write(mermaid() + "\n")


# csrc/kernels.cpp's entries, each a computation a Python function also writes (bit for bit, tests/test_native.py,
# tests/test_q4.py) or a switch and probe of the kernels: none decides what a drafter drafts or when it stops
NATIVE_ENTRIES = {
    "one_row_layers": "fast/loop._one_row_layers", "eagle_rows": "fast/eagle_packed._rows",
    "int8_product": "fast/packed.mm's int8 product",
    "draft_top": "topk of log_softmax", "dense": "fast/packed.Dense's product", "q4_products": "q4's products",
    "q4_lines": "q4's unpacking", "attend_chain": "Forward._attend (chains)", "attend_tree": "Forward._attend (trees)",
    "own_attention": "switch", "tile_attention": "switch", "int8_amx": "switch", "q4_amx": "switch",
    "draft_loops": "switch", "draft_loops_fit": "probe",
}


def test_the_native_module_computes_and_decides_nothing():
    src = (ROOT / "specdec_core" / "fast" / "csrc" / "kernels.cpp").read_text()
    bound = set(re.findall(r'm\.def\("(\w+)"', src))
    assert bound == set(NATIVE_ENTRIES), ("a C++ entry came or went: name the Python it computes, bit for bit, "
                                          f"in NATIVE_ENTRIES (new: {bound - set(NATIVE_ENTRIES)}, "
                                          f"gone: {set(NATIVE_ENTRIES) - bound})")
    # the policies (policy.py) and EAGLE's tree-growing loop are Python only
    for decision in ("deeper_pays", "tree_budget", "copy_budget", "eagle_levels", "_grow"):
        assert decision not in src, f"csrc/kernels.cpp mentions {decision}: a drafter's decision belongs in Python"
