"""Training the bundled target's drafters by self-distillation: `python -m specdec_core train KIND`.

  draft       draft.py: a separate 2-layer Llama started from slices of the target (DistillSpec, Zhou et al. 2024)
  early-exit  early_exit.py: an exit (one decoder layer + norm) after the target's first L layers, L chosen by
              measurement among --layers (LayerSkip, Elhoushi et al. 2024; Kangaroo, Liu et al. 2024)
  medusa      medusa.py: Medusa heads on the target's last hidden state, and the tree they propose
              (Cai et al. 2024)
  eagle       eagle.py: a one-layer head that predicts the target's next hidden state from the current one and
              the next token (EAGLE, Li et al. 2024), drafting EAGLE-2's dynamic tree

All learn by KL to the target's distributions on its own answers: distill.py makes that data (and the
loss), prompts.py adds template prompts to distill.py's hand-written ones, common.py holds what the trainers
share (data loading, the training loop, held-out measurements, the manifest). Each run is seeded, shows progress
and loss, and writes <out>/<kind>.safetensors plus <kind>.manifest.json (data, steps, loss, measured acceptance
on held-out prompts, draft cost, command, versions, sha256).
"""
from __future__ import annotations

import importlib
import sys

from ..drafters import TRAINED as KINDS

# kind -> its trainer module, imported on demand so that using distill.py or prompts.py alone loads no trainer
MODULES = {"draft": "draft", "early-exit": "early_exit", "medusa": "medusa", "eagle": "eagle"}
assert set(MODULES) == set(KINDS), "every drafter with trained weights has a trainer"


def main(kind: str, argv: list[str]) -> int:
    """Entry for `train KIND`; returns the exit status."""
    if kind not in MODULES:
        print(f"train: unknown kind {kind!r}; choose one of: {', '.join(KINDS)}", file=sys.stderr)
        return 2
    return importlib.import_module(f".{MODULES[kind]}", __name__).main(argv)
