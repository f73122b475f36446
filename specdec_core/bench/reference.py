"""Recorded reference results: one run of the lesson's workloads (showcase.workload_rows) and of every drafter
on one prompt (showcase.every), saved with the machine, the date and the command that made it.

A classroom machine is often busy; the pages draw this run faintly beside a live measurement, labelled with its
CPU and date, so a class can tell a noisy live figure from what this project measured on a known machine.
`python -m specdec_core reference` writes a new one (PATH by default).
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

PATH = Path(__file__).resolve().with_name("reference.json")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")   # what decides the CPU's bf16 speed
ROW_KEYS = ("workload", "drafter", "draft_model", "temperature", "requests", "decoded", "expected", "benefit",
            "lands", "why", "speedup", "speedup_min", "speedup_max", "noisy", "acceptance_rate",
            "mean_acceptance_length", "draft_ms", "score_ms", "verify_ms", "commit_ms", "bookkeeping_ms", "step_ms",
            "plain_step_ms", "plain_score_ms", "c", "tokens_per_s", "baseline_tokens_per_s", "repeats")
DRAFTER_KEYS = ("drafter", "k", "acceptance_rate", "tokens_per_step", "draft_ms", "score_ms", "verify_ms",
                "commit_ms", "bookkeeping_ms", "step_ms", "plain_score_ms", "c", "speedup", "speedup_min",
                "speedup_max", "noisy", "same_tokens_as_baseline", "tokens_per_s", "baseline_tokens_per_s")


def machine() -> dict:
    """The CPU's model name and the flags of FLAGS it has, cores, torch's threads and the load average."""
    import torch
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name":
                cpu = val.strip()
            elif key.strip() == "flags":
                flags = set(val.split())
    except OSError:   # not Linux: the model name platform gives, no flags
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"cpu": cpu, "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "load_average": [round(x, 2) for x in load],
            "torch": torch.__version__, "attention": attention(), "products": products()}


def products() -> str:
    """The bundled target's layer products here: "q4-amx" or "q4-dots" (csrc/kernels.cpp's 4-bit kernel on AMX's
    tiles or on AVX-512 BF16 dot products, fast/q4.py; with the dot products the LM head takes them too) or
    "packed" (oneDNN's bf16 product). They sum in different orders, so, as across kernel families, a
    greedy text (and an acceptance measured on it) can differ."""
    from .. import backend
    on = backend.kernel("q4_products")
    kind = backend.q4_kernel()[0] if on is not None and on() else None
    return f"q4-{kind}" if kind else "packed"


def attention() -> str:
    """The attention a packed CPU forward runs here: "loop" (csrc/kernels.cpp's one loop per query, where native.py
    builds it and the CPU runs its AVX-512 loops) or "aten". The two round differently, so, as across kernel
    families, a greedy text (and an acceptance measured on it) can differ between them."""
    from .. import backend
    fit = backend.kernel("draft_loops_fit")      # the same module holds the attention loop
    return "loop" if fit is not None and fit() else "aten"


def kernels(flags) -> str:
    """The family of bf16 kernels a CPU with these flags runs (oneDNN picks by them): "amx", "avx512_bf16" or
    "other". Two CPUs of one family sum a bf16 product in the same order; across families the target's logits can
    differ in their last bits, so a greedy text (and an acceptance measured on it) can differ too."""
    flags = set(flags)
    return "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "other"


def keep(row: dict, keys: tuple[str, ...]) -> dict:
    """The row's JSON-ready fields of `keys` (numbers rounded, booleans and strings kept)."""
    out = {}
    for k in keys:
        v = row.get(k)
        out[k] = round(float(v), 4) if isinstance(v, float) else v
    return out


def record(workloads: list[dict], drafters: list[dict], prompt: str, settings: dict, command: str,
           model: dict, notes: list[str] | None = None) -> dict:
    """A reference run as one JSON-ready dict."""
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine(), "model": model,
            "command": command, "settings": settings, "notes": list(notes or []),
            "workloads": [keep(r, ROW_KEYS) for r in workloads],
            "drafters": {"prompt": prompt, "rows": [keep(r, DRAFTER_KEYS) for r in drafters]}}


def save(ref: dict, path: str | Path = PATH) -> Path:
    path = Path(path)
    path.write_text(json.dumps(ref, indent=1) + "\n")
    return path


def load(path: str | Path = PATH) -> dict | None:
    """The recorded reference, or None when none ships (a missing or unreadable file is no error: the pages
    then show the live measurement alone)."""
    try:
        ref = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return ref if isinstance(ref, dict) and "machine" in ref and "workloads" in ref else None


def label(ref: dict) -> str:
    """How the pages name it: "reference: <cpu>, <date>"."""
    return f"reference: {ref['machine'].get('cpu', 'unknown CPU')}, {ref.get('date', 'undated')}"


def rows_by(ref: dict | None, part: str, key: str) -> dict[str, dict]:
    """The reference's rows of `part` ("workloads", or "drafters") by `key`; {} without a reference."""
    if not ref:
        return {}
    rows = ref.get(part, [])
    rows = rows.get("rows", []) if isinstance(rows, dict) else rows
    return {r[key]: r for r in rows if key in r}
