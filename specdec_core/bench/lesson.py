"""The lesson's workload table checked by what drives it: acceptance, measured with the drafter that fits each
workload (workloads.Workload.drafter), on the workload's own prompts and temperature.

The lesson's categories are about speed; speed is acceptance times what a step costs. With a draft that costs
little next to a target step, a draft of k = 4 whose guesses are kept with probability alpha commits
(1 - alpha^5) / (1 - alpha) tokens a step (Leviathan et al. 2023, eq. 1): about 2 at alpha = 0.5 and 1.3 at 0.25.
So High wants most guesses kept, Moderate some, Low few (BANDS). A row agrees when the 95% interval of its
acceptance (Wilson, from the number of drafted tokens) reaches the lesson's band; when it does not, `note` says
why for that row. Speed itself, by the measuring rule, is the Workloads page's.
"""
from __future__ import annotations

from typing import Callable

from ..engine import run
from ..models import LM
from ..sampling import SamplingParams
from .sweeps import wilson
from .workloads import Workload

# the lesson's category -> the acceptance band that gives it with a cheap draft at k = 4
BANDS = {"High": (0.5, 1.0), "Moderate": (0.25, 0.5), "Low": (0.0, 0.25)}
WHY_DRAFTER = {"lookup": "copies spans of the context", "draft": "the small distilled draft model",
               "eagle": "a trained head reading the target's own hidden state", "medusa": "trained heads",
               "early-exit": "the target's first layers", "suffix": "copies earlier outputs"}
# per workload, why a short run on this machine can land outside the lesson's band
ASIDE = {
    "code": "code's predictable stretches are idioms the draft learned; a prompt that asks for logic it has not "
            "seen forks early",
    "json": "keys and braces are easy, but the values inside them are free text the draft must guess",
    "extraction": "lookup wins only where the answer copies the context word for word; where the model "
                  "rephrases or adds its own framing there is nothing to copy",
    "chat": "a 135 M-parameter target's chat is less peaked than a large model's, and two prompts are a small sample",
    "creative": "EAGLE reads the target's own hidden state, so even hot sampling keeps some of its guesses; the "
                "lesson's Low is about speed, where the draft's cost eats what these guesses save",
    "batch": "the lesson's Low is about a full batch spending the idle compute, not about acceptance: these rows "
             "decode one request at a time, so section 6 (batching) is where this row is measured",
}


def band(expected: str) -> tuple[float, float]:
    """The acceptance band of a lesson's category ('Low, possibly negative' is Low)."""
    for name, b in BANDS.items():
        if expected.startswith(name):
            return b
    raise ValueError(f"no acceptance band for the category {expected!r}; known: {', '.join(BANDS)}")


def verdict(w: Workload, accepted: int, drafted: int) -> tuple[bool | None, str]:
    """(agrees, note): whether the acceptance's 95% interval reaches the lesson's band, and why not when not;
    agrees is None for a workload whose category acceptance cannot show (a batch)."""
    if w.batch_size > 1:
        return None, ASIDE["batch"]
    lo, hi = band(w.expected)
    a_lo, a_hi = wilson(accepted, drafted)
    rate = accepted / drafted if drafted else 0.0
    if drafted == 0:
        return False, f"{w.drafter} proposed nothing on these prompts, so there is no acceptance to read"
    if a_hi >= lo and a_lo <= hi:
        return True, f"{rate:.0%} of {drafted} guesses kept: in the lesson's band for {w.expected}"
    side = "above" if a_lo > hi else "below"
    return False, (f"{rate:.0%} of {drafted} guesses kept, {side} the band for {w.expected} "
                   f"({lo:.0%}-{hi:.0%}): " + ASIDE.get(w.name, "a short run on a few prompts"))


def check(lm: LM, workloads: list[Workload], make: Callable[[str], object], tokens: int = 24, k: int = 4,
          prompts: int = 2, tick: Callable[[str], None] | None = None) -> list[dict]:
    """Each workload's first `prompts` prompts decoded with its own drafter (`make(name)` builds one) at its own
    temperature (seed 0), `tokens` new tokens each -> one row per workload: counts pooled over its prompts, the
    lesson's category beside the measured acceptance, and the verdict. A batch workload is not decoded here:
    its category is about a full batch, not acceptance (verdict)."""
    if tokens < 1 or k < 1 or prompts < 1:
        raise ValueError(f"tokens, k and prompts must be at least 1, got {tokens}, {k}, {prompts}")
    rows = []
    for w in workloads:
        sp = SamplingParams(temperature=w.temperature, seed=0)
        drafted = accepted = committed = steps = 0
        for text in w.prompts[:prompts] if w.batch_size == 1 else ():
            _, _, m = run(lm, make(w.drafter), lm.encode(text).tolist(), sp=sp, k=k, max_new_tokens=tokens,
                          detail=False)
            drafted, accepted = drafted + m.drafted, accepted + m.accepted
            committed, steps = committed + m.tokens, steps + m.steps
            if tick:
                tick(f"{w.name}, {w.drafter}")
        ok, note = verdict(w, accepted, drafted)
        lo, hi = wilson(accepted, drafted)
        rows.append({"workload": w.label, "expected": w.expected, "drafter": w.drafter,
                     "why this drafter": WHY_DRAFTER.get(w.drafter, ""), "temperature": w.temperature,
                     "acceptance": accepted / drafted if drafted else None, "acceptance_lo": lo, "acceptance_hi": hi,
                     "drafted": drafted, "mean acceptance length": committed / steps if steps else None,
                     "agrees": ok, "note": note})
    return rows


def refusal(target: LM) -> str:
    """Pair the target with a real (tiny, random) model whose tokenizer splits text into letters: the refusal's
    message (check_compatible), the lesson's "a draft must share the target's vocabulary" shown, not told."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from ..models import IncompatibleModels, check_compatible
    letters = list("abcdefghijklmnopqrstuvwxyz ") + ["<s>", "</s>", "<unk>"]
    tk = Tokenizer(models.WordLevel({c: i for i, c in enumerate(letters)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    cfg = LlamaConfig(vocab_size=len(letters), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    draft = LM(LlamaForCausalLM(cfg).eval(), tok, "letters-only draft (1 layer)")
    try:
        check_compatible(target, draft)
    except IncompatibleModels as e:
        return str(e)
    raise AssertionError("a draft with another vocabulary was accepted as compatible")
