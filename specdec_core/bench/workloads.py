"""The lesson's six workloads, each with prompts written for this project.

The expected benefit and its reason are the lesson's claims; the pages that measure them put our own
figures beside them. Prompts are short so a CPU run finishes in seconds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent.parent / "prompts"


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    expected: str      # the lesson's expected benefit
    why: str           # the lesson's reason, in our words
    temperature: float  # the temperature this kind of traffic usually runs at
    prompts: tuple[str, ...]
    batch_size: int = 1
    drafter: str = "lookup"   # the drafter that shows this workload's effect best (measured; docs/measurements.md)
    draft_model: str = "distilled"   # for drafter `draft`: the shipped distilled draft, or "bundled"
    lands: tuple[str, ...] = ()      # measured benefits (benefit()) that agree with the lesson; () = `expected`
    draft_sampling: str = "sample"   # how a model draft picks its guesses at T > 0 (sampling.SamplingParams)

    def agrees(self, measured: str) -> bool:
        """Whether a measured benefit (benefit()) lands in the lesson's category for this workload."""
        return measured in (self.lands or (self.expected,))


def benefit(speedup: float) -> str:
    """A measured speedup in the lesson's words: High >= 1.5x, Moderate 1.15-1.5x, Low 1-1.15x, Negative < 1x."""
    if speedup >= 1.5:
        return "High"
    if speedup >= 1.15:
        return "Moderate"
    if speedup >= 1.0:
        return "Low"
    return "Negative"


def _load(name: str) -> tuple[str, ...]:
    with open(PROMPT_DIR / f"{name}.jsonl") as f:
        return tuple(json.loads(line)["prompt"] for line in f if line.strip())


def load_jsonl(path: str | Path) -> list[dict]:
    """Read a prompts file: one JSON object per line with a `prompt` field (and optionally `id`, `category`)."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
                raise ValueError(f"{path}:{n}: each line needs a non-empty string field 'prompt'")
            row.setdefault("id", f"{Path(path).stem}-{n}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts in the file")
    return rows


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("code", "Code completion, boilerplate", "High",
             "syntax and idiom make the next token predictable, and code runs greedy or nearly so",
             0.0, _load("code"), drafter="eagle"),
    Workload("json", "Structured output (JSON, forms, templates)", "High",
             "braces, keys and delimiters are dictated by the format, so even a weak draft guesses them",
             0.0, _load("json"), drafter="eagle"),
    Workload("extraction", "Extraction, editing, RAG answers quoting sources", "High",
             "the answer copies spans of the context, the easiest text to draft; prompt lookup shines here",
             0.0, _load("extraction"), drafter="lookup"),
    Workload("chat", "Low-temperature factual chat", "Moderate",
             "peaked distributions keep acceptance decent, but prose forks more often than code",
             0.3, _load("chat"), drafter="lookup"),
    Workload("creative", "High-temperature creative writing", "Low",
             "hot sampling flattens both distributions, so drafts rarely match what the target samples",
             1.2, _load("creative"), drafter="draft", lands=("Low", "Negative")),
    Workload("batch", "Throughput-saturated batch serving", "Low, possibly negative",
             "a full batch already spends the idle compute speculation would use, so verification competes "
             "with other requests", 0.0, _load("chat") + _load("code"), batch_size=32, drafter="lookup",
             lands=("Low", "Negative")),
]}

# The temperature page's opening demo (drafter, workload): chosen by measurement so that it starts where speculation
# pays (T = 0, most guesses kept) and shows acceptance and speedup falling as T rises (docs/measurements.md, "Demos
# that land on their defaults").
TEMPERATURE_DEMO = ("eagle", "code")

