"""`python -m specdec_core train early-exit`: self-distil an early exit for the bundled target.

LayerSkip (Elhoushi et al. 2024) and Kangaroo (Liu et al. 2024): the draft is the target's own first L layers
plus a trained exit (one decoder layer and an RMSNorm) before the shared LM head. Every candidate L of
`--layers` gets an exit, trained together over one frozen trunk pass per step; the shipped one is the L with
the largest predicted speedup from its measured held-out agreement and draft cost (Leviathan et al. 2023,
sec. 3).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..drafters import early_exit as ee, target_record
from . import distill
from .common import (acceptance, chain_parser, fit, heldout, parse_chain_args, prepare, target_step_cost,
                     time_forward, vocab_desc, write_manifest)

STEPS = 700  # sized to finish within 30 minutes on 2 quiet cores


def main(argv: list[str]) -> int:
    ap = chain_parser("early-exit", STEPS)
    ap.add_argument("--layers", default="1,2,3", help="candidate exit layers L, trained together")
    return train_early_exit(parse_chain_args(ap, argv), argv)


def train_early_exit(a, argv) -> int:
    t_start = time.perf_counter()
    lm, rows, desc, vocab = prepare(a)
    cands = sorted({int(x) for x in a.layers.split(",")})
    model = lm.model
    exits = {L: ee.Exit.for_target(model, L, vocab).train() for L in cands}
    tr = ee.trunk(model, max(cands))
    grab = {}
    hooks = [tr.layers[L - 1].register_forward_hook(
        lambda mod, inp, out, L=L: grab.__setitem__(L, out[0] if isinstance(out, tuple) else out)) for L in cands]
    head_w = vocab.head(model.get_output_embeddings().weight.detach())

    def prep(ids, mask):
        tr(input_ids=ids, attention_mask=mask, use_cache=False)  # frozen trunk, bf16; hooks keep each candidate's h
        return mask, dict(grab)

    def student(L):
        net = ee.stack(model, [exits[L].layer], exits[L].norm)  # the exit alone, fed the trunk's state
        return lambda pre, sel: net(inputs_embeds=pre[1][L].float(), attention_mask=pre[0],
                                    use_cache=False).last_hidden_state[sel]
    losses, train_s = fit({L: (list(exits[L].parameters()), student(L)) for L in cands}, prep, head_w, vocab,
                          rows, a, f"train early exits L={cands}")
    for hk in hooks:
        hk.remove()

    # choose L: held-out greedy agreement alpha and measured cost c = draft forward / target forward give the
    # expected speedup E/(k c + 1) with E = 1 + alpha + ... + alpha^k (independent positions, Leviathan sec. 3)
    held = heldout(lm, a.eval_prompts)
    t_t = target_step_cost(lm)
    sweep = {}
    for L, e in exits.items():
        d = ee.EarlyExit(lm, e.eval())
        agree, n = 0, 0
        with torch.inference_mode():
            for s, pl, ti, _ in held:
                h = d.net(input_ids=torch.tensor([s])).last_hidden_state[0, pl - 1:len(s) - 1]
                g = d.vocab.ids[F.linear(h, d.head_w).argmax(-1)]
                agree += int((g == ti[pl - 1:len(s) - 1, 0].long()).sum())
                n += len(s) - pl
        alpha = agree / max(n, 1)
        d.begin([])
        d.sync(lm.encode(distill.HELDOUT[0]).tolist())
        c = time_forward(lambda: (d.run([5]), d.cache.crop(-1))) / t_t
        best = max(((sum(alpha ** i for i in range(k + 1)) / (k * c + 1), k) for k in range(1, 7)))
        sweep[L] = dict(greedy_agreement=round(alpha, 4), final_kl=losses[L], cost_ratio=round(c, 3),
                        predicted_speedup=round(best[0], 3), best_k=best[1])
        print(f"L={L}: agreement {alpha:.3f}, cost {c:.3f} of a target forward, "
              f"predicted speedup {best[0]:.2f}x at k={best[1]}")
    L = max(sweep, key=lambda x: sweep[x]["predicted_speedup"])
    k = sweep[L]["best_k"]
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "early-exit.safetensors"
    ee.save(exits[L].float(), path, {"default_k": k, "seed": a.seed})
    shipped = ee.load_exit(model, path)  # measure exactly what ships
    acc = acceptance(lm, ee.EarlyExit(lm, shipped, default_k=k), distill.HELDOUT[:a.eval_prompts], k, a.eval_tokens)
    write_manifest("early-exit", a, argv, path, dict(
        **target_record(lm),
        model=dict(exit_layer=L, default_k=k,
                   exit="one decoder layer (attention + MLP, started from the target's last layer) and an RMSNorm "
                        f"after the target's first {L} layers; those layers and the tied LM head are shared, not "
                        "shipped; the head scores the draft vocabulary only"),
        vocab=vocab_desc(vocab, rows, held),
        choice=dict(candidates=sweep, chosen=L,
                    why="largest predicted speedup from measured held-out agreement and measured draft cost"),
        data=desc, steps=a.steps, batch=a.batch, lr=a.lr, loss="KL(p || q) over top-64 + rest",
        final_loss=losses[L], train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1),
        cost=dict(target_forward_ms=round(t_t * 1e3, 2), ratio=sweep[L]["cost_ratio"],
                  how="best of 9 one-token forwards with a warm cache, bf16"),
        acceptance=acc))
    return 0
