"""The race's pairs: the live pair and more pairs timed back to back by the measuring rule, and the median one.

The rule is the measurement pages' (specdec_core/bench/sweeps.py): sweeps.rounds gives each repeat its order
(plain first, then flipped, so neither side always runs on a warmer machine) and, at T > 0, its seed;
sweeps.ratios quotes the median pair with its spread. The race then replays that median pair, so the lanes and
the verdict tell the same story.
"""
from __future__ import annotations

import dataclasses

from specdec_core import drafters, engine
from specdec_core.bench import sweeps

from . import runs, turns


@dataclasses.dataclass
class Timed:
    """Every pair's runs (index 0 is the live pair), the quoted timing, and which pair it is."""
    plain: list[runs.Run]
    spec: list[runs.Run]
    timing: dict
    median: int


def time_pairs(s: runs.Settings, plain: runs.Run, spec: runs.Run, prog) -> Timed:
    """Time sweeps.REPEATS pairs in all (the live one counts as the first, plain then speculative), each pair
    back to back in the order sweeps.rounds gives; records kept (detail on, as the live pair) for the replay."""
    tgt = runs.target()
    # suffix decoding drafts from the session's index, to which the live run just added its own text: a repeat that
    # drafted from it would copy the answer, so each repeat sees the index as the live run did
    lanes = {"plain": (drafters.make(drafters.PLAIN, tgt), 0),
             "spec": (runs.make_drafter(s, tgt, before=spec.index_from), int(s.k))}
    got = {"plain": [plain], "spec": [spec]}
    with turns.hold(turns.shown(prog)) as turn:   # the shared model, one turn at a time (app/turns.py)
        for r, sp, order in sweeps.rounds(s.sampling(), sweeps.REPEATS, ["plain", "spec"]):
            if r == 0:
                continue                            # the live pair
            for name in order:
                d, k = lanes[name]
                _, recs, _ = engine.run(tgt, d, plain.prompt_ids, sp=sp, k=k, max_new_tokens=int(s.max_new_tokens),
                                        k_policy=s.k_policy if k else "fixed")
                base = plain if name == "plain" else spec
                got[name].append(dataclasses.replace(base, records=recs, status="done"))
            prog.progress(r / (sweeps.REPEATS - 1), text=f"Timed {r + 1} of {sweeps.REPEATS} pairs")
            turn.spell()   # between pairs (never inside one) others may take a turn
    if spec.index_from is not None:   # the session keeps the live run's text once, not the repeats' copies
        ix = runs.session_index()
        for d in [d for d in ix.docs if d > spec.index_from]:
            ix.drop(d)
    tps = {n: [x.metrics.tokens_per_s for x in v] for n, v in got.items()}
    timing = sweeps.ratios(tps["spec"], tps["plain"])
    return Timed(got["plain"], got["spec"], timing, timing["median_pair"])
