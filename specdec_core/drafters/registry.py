"""What each drafter is, asked by name: the one place outside the drafters themselves that knows their names.

An `Entry` says what a drafter does (its description, default k, whether it reports a distribution q or drafts
deterministically, whether it reads the target's hidden states, whether it proposes a tree), what it needs
(trained weights, a separate draft model) and, through `weights_for`, whether the weights it needs were trained
for a given target: decided by the target recorded in the weights' manifest (`weights/<stem>.manifest.json`),
never by a model's display name. It imports no drafter (the package's `make` and `resolve_draft` build them),
so the drafters may import it. Plain decoding is the entry whose default k is 0: it drafts nothing, so
callers ask `entry(name).k(k)` rather than compare names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"

PLAIN = "none"            # the baseline every measurement compares against
BUNDLED = "bundled"       # draft-model spec: the target drafts for itself
DISTILLED = "distilled"   # draft-model spec: the small draft trained for the target (weights/draft.*)
SHIPPED = (BUNDLED, DISTILLED)   # draft-model specs that load nothing new


class DrafterUnavailable(ValueError):
    """The named drafter cannot run with what was given."""


@dataclass(frozen=True)
class Entry:
    name: str
    description: str
    default_k: int             # tokens drafted per step unless asked otherwise; 0 = drafts nothing (trained
                               # drafters refine theirs from their weights: a built drafter's default_k wins)
    reports_q: bool = False    # samples from a distribution q of its own (else deterministic: one-hot q)
    reads_hidden: bool = False  # reads the target's hidden states (Drafter.observe)
    tree: bool = False         # proposes a tree of candidates rather than a chain
    weights: str | None = None  # stem of the trained weights it needs in weights/, None = none
    draft_model: bool = False  # runs a separate draft model, named by a draft-model spec
    session_index: bool = False  # drafts from what earlier runs of the same session generated

    @property
    def drafts(self) -> bool:
        """False for plain decoding: no draft, no k."""
        return self.default_k > 0

    def k(self, k: int | None) -> int | None:
        """The draft length to run this drafter with when k is asked for: 0 when it drafts nothing, else k
        (None stays None: the built drafter's own default_k)."""
        return 0 if not self.drafts else None if k is None else int(k)

    def policy(self, k_policy: str) -> str:
        """The draft-length policy (policy.py) to run it with: a drafter that drafts nothing has only `fixed`."""
        return k_policy if self.drafts else "fixed"


ENTRIES = {e.name: e for e in (
    Entry(PLAIN, "plain decoding: one target forward per token (the baseline)", 0),
    Entry("lookup", "prompt lookup: copy what followed the earliest earlier match of the text's last few tokens", 11),
    Entry("suffix", "suffix decoding: a tree of the most frequent continuations seen before in this session", 8,
          tree=True, session_index=True),
    Entry("draft", "a separate, smaller draft model with the same vocabulary", 3, reports_q=True,
          weights="draft", draft_model=True),
    Entry("early-exit", "self-speculation: the target's first layers plus a trained exit draft", 3,
          reports_q=True, weights="early-exit"),
    Entry("medusa", "extra heads on the target propose a tree of candidates, verified in one pass", 4,
          reads_hidden=True, tree=True, weights="medusa"),
    Entry("eagle", "a one-layer head drafts the target's next hidden states; a tree shaped by its confidence", 5,
          reads_hidden=True, tree=True, weights="eagle"),
)}
NAMES = tuple(ENTRIES)
DESCRIPTIONS = {n: e.description for n, e in ENTRIES.items()}
SPECULATIVE = tuple(n for n, e in ENTRIES.items() if e.drafts)        # what is measured against PLAIN
MODEL_DRAFTS = tuple(n for n, e in ENTRIES.items() if e.reports_q)    # a drafting mode (greedy/sample) applies
TRAINED = tuple(n for n, e in ENTRIES.items() if e.weights)           # `python -m specdec_core train NAME`


def entry(name: str) -> Entry:
    try:
        return ENTRIES[name]
    except (KeyError, TypeError):
        raise DrafterUnavailable(f"unknown drafter {name!r}; choose from {', '.join(NAMES)}") from None


def manifest(stem: str, folder: Path | None = None) -> dict:
    """The manifest written beside trained weights `stem` ({} when there is none)."""
    path = Path(folder or WEIGHTS) / f"{stem}.manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def target_record(target) -> dict:
    """What a manifest records of the target its weights were trained for: its name and the shapes the
    weights depend on (a model of another size under the same name still does not match)."""
    c = target.model.config
    return {"target": target.name, "target_shape": {"vocab_size": int(c.vocab_size),
                                                    "hidden_size": int(c.hidden_size),
                                                    "num_hidden_layers": int(c.num_hidden_layers)}}


def trained_for(man: dict, target) -> bool:
    """Whether a manifest records `target` as the target its weights were trained for."""
    if not man.get("target"):
        return False
    want = target_record(target)
    return man["target"] == want["target"] and man.get("target_shape", want["target_shape"]) == want["target_shape"]


def weights_for(name: str, target, folder: Path | None = None) -> bool:
    """Whether trained weights for drafter `name` ship for `target` (False when it needs none)."""
    stem = entry(name).weights
    if stem is None or not (Path(folder or WEIGHTS) / f"{stem}.safetensors").exists():
        return False
    return trained_for(manifest(stem, folder), target)


def runs_on(name: str, target) -> bool:
    """Whether `make(name, target)` works without a draft model being given."""
    e = entry(name)
    return e.weights is None or weights_for(name, target)


def untrained(name: str, target) -> DrafterUnavailable:
    """The error for a drafter whose weights were not trained for `target`."""
    stem = entry(name).weights
    rec = manifest(stem).get("target")
    why = f"they were trained for {rec!r}" if rec else "none are shipped"
    return DrafterUnavailable(f"drafter {name!r} has no trained weights for {target.name!r} ({why}): train them "
                              f"with `python -m specdec_core train {stem}`")


def load_weights(path: Path, kind: str) -> tuple[dict, dict, dict]:
    """Trained weights at `path` -> (tensors, the file's metadata, the manifest beside it or {}). The one
    loader every trained drafter reads through; a missing file is a DrafterUnavailable that says how to train it."""
    from safetensors import safe_open
    path = Path(path)
    if not path.exists():
        raise DrafterUnavailable(f"no trained {kind} weights at {path.name}: run "
                                 f"`python -m specdec_core train {kind}` to produce them")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        sd = {k: f.get_tensor(k) for k in f.keys()}
    return sd, meta, manifest(path.name.removesuffix(".safetensors"), path.parent)
