"""Batch size: baseline and speculative throughput and the speedup against batch size (sweeps.sweep_batch over
batch.py's ragged batched decoding), showing where speculation stops paying. The lesson's point: batching is
another way to use the idle compute of decode, and at high load usually the better one."""
from functools import partial

import pandas as pd
import streamlit as st

from app import charts, limits, measure, sidebar
from specdec_core.bench import sweeps
from specdec_core.bench.workloads import WORKLOADS

KEY = "measure_batch"
SIZES = [1, 2, 4, 8, 16, 32, 64]
measure.settle(KEY, bs_workload=measure.workload_or_first("batch"), bs_max_new=32, bs_by_size=False)

st.title("Batch size: when does speculation stop paying?")
st.markdown(
    "**What the lesson predicts.** A server decodes many requests together. Each decode step of a small batch "
    "leaves the hardware idle (on a GPU it waits on memory), and speculation fills that idle time with "
    "verification. A large batch already fills it with other requests, so the extra tokens speculation scores "
    "compete with real work: its speedup shrinks as the batch grows and can fall below 1×. Here one batch of "
    "B requests is decoded together, plainly and with each drafter, for each batch size B.")

s = sidebar.current()
c1, c2 = st.columns([3, 2])
with c1:
    names = measure.pick_drafters("bs_drafters")
    sizes = measure.pick_values("Batch sizes", "bs_sizes", SIZES, [1, 4, 16],
                                help="32 and 64 take a while on a CPU.")
with c2:
    wl = st.selectbox("Requests from the workload", list(WORKLOADS), key="bs_workload",
                      format_func=lambda n: WORKLOADS[n].label,
                      help="A batch of B requests cycles through this workload's prompts.")
    max_new = limits.tokens_input(st, "New tokens per request", 4, 256, key="bs_max_new", step=8)
    by_size = st.toggle("k by batch size (as vLLM can be set to)", key="bs_by_size",
                        help=f"k = the sidebar's k for one request, at most 2 up to 4 requests, 1 up to 16, and no "
                             "drafting past that: the fuller the batch, the less spare compute verification can use.")
params = {"drafters": ", ".join(measure.label(n, s) for n in names) or "none", "k": s.k,
          "batch sizes": ", ".join(map(str, sizes)), "workload": wl, "new tokens": max_new,
          "temperature": s.temperature, "seed": s.seed, "k by batch size": by_size}
go_clicked = st.button("Sweep the batch size", type="primary", key="bs_go", icon=":material/stacks:",
                       disabled=not (names and sizes))
st.caption(f"Sidebar settings used: k = {s.k}, temperature {s.temperature:g}, seed {s.seed}.")


figure = partial(charts.batch_figure, sizes=SIZES)


def points(tgt, specs, live):
    ids = measure.encode(tgt, WORKLOADS[wl].prompts)
    sp = measure.sampling(s.temperature, s)
    yield from measure.sweep_points(sweeps.sweep_batch, tgt, specs, ids, sizes, s, live, k=s.k,
                                    temperature=sp.temperature, max_new_tokens=max_new, seed=s.seed,
                                    k_policy="batch" if by_size else "fixed")


def sweep() -> None:
    measure.measure(KEY, params, names, s, lambda specs: 2 * sweeps.REPEATS * len(specs) * len(sizes), points,
                    figure, "Sweeping")


res = measure.results(KEY, params, go_clicked, sweep,
                      "Pick drafters and batch sizes, then press **Sweep the batch size**.")

measure.noise_note(res.rows)
st.plotly_chart(figure(res.rows), key="bs_chart", width="stretch")
df = pd.DataFrame(res.rows)
lines = []
for d, g in df.groupby("drafter", sort=False):
    g = g.sort_values("batch_size")
    losing = g[g["speedup"] < 1.0]
    where = (f"it stops paying at batch size **{int(losing.iloc[0]['batch_size'])}** "
             f"({losing.iloc[0]['speedup']:.2f}×)" if len(losing) else
             f"it still pays at the largest batch measured ({g.iloc[-1]['speedup']:.2f}× at "
             f"{int(g.iloc[-1]['batch_size'])})")
    lines.append(f"- `{d}`: {g.iloc[0]['speedup']:.2f}× at batch size {int(g.iloc[0]['batch_size'])}; {where}.")
st.markdown("**What we measured.**\n" + "\n".join(lines))
st.markdown(
    "**How to read it.** Left: tokens per second summed over every request in the batch; plain decoding "
    "(dashed) gains from batching because one forward pass serves every request. Right: speculative over plain "
    "throughput at the same batch size; below the dashed line speculation makes the server slower.")
st.markdown(
    "**Why a CPU may differ from the lesson.** On a GPU a decode step for 1 request and for 16 takes about the "
    "same time until the arithmetic units fill up: batching and speculation both spend that spare capacity, "
    "and at high load batching, which needs no acceptance luck, is the better use of it. A CPU has far less "
    "to spare; the dashed line shows how much batching still gains here all the same. Speculation inside a "
    "batch pays for the longest draft in every row (acceptance is ragged, so rows are padded to the same "
    "length) and computes the rejected positions of every row, so its cost grows with the batch while its "
    "gain per request does not. The requests also differ: a larger batch mixes in prompts that are easier "
    "or harder to draft, which moves the acceptance rate too.")
cols = ["drafter", "batch_size", "acceptance_rate", "acceptance_lo", "acceptance_hi", "drafted",
        "mean_acceptance_length", "tokens_per_s", "baseline_tokens_per_s", "speedup", "speedup_min", "speedup_max",
        "noisy", "tokens", "target_forwards", "baseline_target_forwards",
        "same_tokens_as_baseline"]
measure.table(df[[c for c in cols if c in df]].round(3), "batch",
              main=["drafter", "batch_size", "acceptance_rate", "acceptance_lo", "acceptance_hi", "drafted",
                    "mean_acceptance_length", "speedup", "speedup_min", "speedup_max", "noisy"])
