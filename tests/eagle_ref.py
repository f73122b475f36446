"""The EAGLE head's trained module behind the packed head's call signature, for a drafter made with the fast path:
drafters/eagle.HeadRows, the reference the packed path is tested against."""
from __future__ import annotations

from specdec_core.drafters.eagle import HeadRows, head_weight


def ModuleStep(drafter) -> HeadRows:   # noqa: N802 - named as the tests read it
    """drafter's level computation through its trained module (in fp32)."""
    lm_w = head_weight(drafter.head, drafter.target.model.get_output_embeddings())
    ids = drafter.head.vocab.ids if drafter.head.vocab is not None else None
    return HeadRows(drafter.head, drafter.target.model.get_input_embeddings().weight, lm_w, ids)
