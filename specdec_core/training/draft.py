"""`python -m specdec_core train draft`: self-distil a separate 2-layer draft model from the bundled target.

DistillSpec (Zhou et al. 2024): a LlamaForCausalLM whose layers start from slices of the target's
(`--init-layers`), trained by KL to the target's distributions on its own answers (common.py). The embedding and
tied LM head are the target's and stay frozen, so only the decoder layers, the final norm and the draft
vocabulary ship (drafters/distilled.py loads them).
"""
from __future__ import annotations

import time

from ..drafters import distilled, target_record
from ..drafters.draft_model import DraftModel
from . import distill
from .common import (acceptance, chain_parser, fit, heldout, parse_chain_args, prepare, target_step_cost,
                     vocab_desc, write_manifest)

STEPS = 1800  # sized to finish within 30 minutes on 2 quiet cores


def main(argv: list[str]) -> int:
    ap = chain_parser("draft", STEPS)
    ap.add_argument("--init-layers", default="0,29", help="target layers the draft's layers start from")
    ap.add_argument("--k", type=int, default=4, help="draft length for the acceptance measurement")
    return train_draft(parse_chain_args(ap, argv), argv)


def train_draft(a, argv) -> int:
    t_start = time.perf_counter()
    lm, rows, desc, vocab = prepare(a)
    layers = [int(x) for x in a.init_layers.split(",")]
    m = distilled.from_target(lm.model, layers).train()
    m.model.embed_tokens.weight.requires_grad_(False)  # shared with the target at load time: must not move
    params = [p for p in m.parameters() if p.requires_grad]
    head_w = vocab.head(m.model.embed_tokens.weight.detach())

    def hidden(pre, sel):
        return m.model(input_ids=pre[0], attention_mask=pre[1], use_cache=False).last_hidden_state[sel]  # [N, d]
    losses, train_s = fit({"draft": (params, hidden)}, lambda ids, mask: (ids, mask), head_w, vocab, rows, a,
                          "train draft")

    a.out.mkdir(parents=True, exist_ok=True)
    path = distilled.save(m, a.out, vocab, {"init_layers": a.init_layers, "seed": a.seed})
    draft = distilled.load_draft(lm, a.out)  # measure exactly what ships
    acc = acceptance(lm, DraftModel(draft, lm), distill.HELDOUT[:a.eval_prompts], a.k, a.eval_tokens)
    t_t = target_step_cost(lm)
    t_d = target_step_cost(draft)
    write_manifest("draft", a, argv, path, dict(
        **target_record(lm),
        model=dict(architecture="LlamaForCausalLM", config="draft.config.json", layers=len(layers),
                   init_from_target_layers=layers, hidden=m.config.hidden_size,
                   intermediate=m.config.intermediate_size,
                   shipped="decoder layers + final norm (bf16) and the draft vocabulary; the embedding and tied "
                           "LM head are the target's, filled in at load time (frozen during training)"),
        vocab=vocab_desc(vocab, rows, heldout(lm, a.eval_prompts)),
        data=desc, steps=a.steps, batch=a.batch, lr=a.lr, loss="KL(p || q) over top-64 + rest",
        final_loss=losses["draft"], train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1),
        cost=dict(draft_forward_ms=round(t_d * 1e3, 2), target_forward_ms=round(t_t * 1e3, 2),
                  ratio=round(t_d / t_t, 3), how="best of 9 one-token forwards with a warm cache, bf16"),
        acceptance=acc))
    return 0
