"""Our settings translated into the configuration of the serving engines the lesson names.

`translate(settings)` returns, for vLLM, SGLang, TensorRT-LLM, llama.cpp and Hugging Face transformers: the
engine's own keys for the draft source, the draft length k and the sampling settings, a snippet to paste,
the engine's names for our metrics, and the docs the entry was checked against; `markdown(settings)` writes
the same as Markdown for the checklist's report. Where an engine has no counterpart for one of our settings
it says "no equivalent" instead of guessing a flag. Engines move fast: every engine lists the pages its
entry came from, so a reader can check the current spelling.
Leviathan et al. (ICML 2023) and Chen et al. (2023) for the algorithm; Medusa: Cai et al. (2024).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from specdec_core import drafters
from specdec_core.drafters.lookup import PromptLookup

NO = "no equivalent"

# the metrics we report (metrics.py), in vLLM's words; EngineConfig.metrics gives each engine's own
METRICS = ("acceptance rate", "mean acceptance length", "TTFT", "TPOT", "throughput")

DOCS = {
    "vllm": ["https://docs.vllm.ai/en/latest/features/speculative_decoding/n_gram/",
             "https://docs.vllm.ai/en/v0.9.1/features/spec_decode.html",
             "https://docs.vllm.ai/en/v0.11.0/api/vllm/config/speculative.html",
             "https://docs.vllm.ai/en/stable/features/per_request_metrics/",
             "https://docs.vllm.ai/en/stable/features/speculative_decoding/acceptance_metrics/"],
    "sglang": ["https://docs.sglang.io/docs/advanced_features/speculative_decoding",
               "https://docs.sglang.io/advanced_features/speculative_decoding.html"],
    "tensorrt-llm": ["https://nvidia.github.io/TensorRT-LLM/features/speculative-decoding.html",
                     "https://nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/reference/NGramDecodingConfig.html",
                     "https://nvidia.github.io/TensorRT-LLM/examples/llm_medusa_decoding.html"],
    "llama.cpp": ["https://github.com/ggml-org/llama.cpp/blob/master/docs/speculative.md",
                  "https://github.com/ggml-org/llama.cpp/pull/10455"],
    "transformers": ["https://huggingface.co/docs/transformers/main/en/assisted_decoding"],
}
TITLES = {"vllm": "vLLM", "sglang": "SGLang", "tensorrt-llm": "TensorRT-LLM", "llama.cpp": "llama.cpp",
          "transformers": "Hugging Face transformers"}
ENGINES = tuple(TITLES)

# the n-gram sizes our lookup drafter searches: read from its defaults, so the translation cannot drift
LOOKUP_MAX_N, LOOKUP_MIN_N = PromptLookup().max_ngram, PromptLookup().min_ngram
NGRAMS = f"{LOOKUP_MIN_N}..{LOOKUP_MAX_N}"


@dataclass
class EngineConfig:
    engine: str
    title: str
    supported: bool                      # the draft source has a counterpart in this engine
    speculative: dict                    # the engine's keys for the draft source and k (empty: none apply)
    sampling: dict                       # the engine's keys for temperature, top-p, seed, max tokens: those it has
    snippet: str                         # a command line or Python call to paste
    metrics: dict[str, str]              # our metric -> the engine's name for it, or "no equivalent ..."
    gaps: list[str] = field(default_factory=list)  # settings with no counterpart, in words
    docs: list[str] = field(default_factory=list)


def _draft_path(s) -> str:
    # `bundled` and `distilled` are our names; a real deployment points at its own draft checkpoint
    spec = (s.draft_model or "").strip()
    return "<your-draft-model>" if not spec or spec in drafters.SHIPPED else spec


def _pick(table: dict, s) -> tuple[dict, list[str]]:
    """An engine's table, drafter name -> settings -> (its keys for the draft source, gaps in words); a drafter
    the table lacks (plain decoding) has neither."""
    spec, gaps = table[s.drafter](s) if s.drafter in table else ({}, [])
    return dict(spec), list(gaps)


def _supported(s, spec: dict) -> bool:
    """Plain decoding runs on every engine; a drafter only where the engine has keys for it."""
    return not drafters.entry(s.drafter).drafts or bool(spec)


VLLM = {
    "lookup": lambda s: ({"method": "ngram", "num_speculative_tokens": s.k,
                          "prompt_lookup_max": LOOKUP_MAX_N, "prompt_lookup_min": LOOKUP_MIN_N}, []),
    "draft": lambda s: ({"model": _draft_path(s), "num_speculative_tokens": s.k}, []),
    "medusa": lambda s: ({"method": "medusa", "model": "<your-medusa-heads>", "num_speculative_tokens": s.k},
                         ["our Medusa tree shape (which children are tried) has no documented key in "
                          "speculative_config; heads must be exported in a format vLLM loads"]),
    "eagle": lambda s: ({"method": "eagle", "model": "<your-eagle-head>", "num_speculative_tokens": s.k},
                        ["our EAGLE head would need exporting in the format vLLM's EAGLE loads; vLLM sizes its tree "
                         "with its own settings, not our dynamic 8-node tree"]),
    "suffix": lambda s: ({"method": "suffix", "num_speculative_tokens": s.k},
                         ["vLLM's suffix decoding comes from the arctic-inference package; its tree-size and "
                          "frequency settings have their own names, and its cache spans requests like our session "
                          "index"]),
    "early-exit": lambda s: ({}, ["early exit (the target's first layers plus a trained exit) has no equivalent "
                                  "method; vLLM's nearest self-drafting methods are EAGLE and MTP, which need their "
                                  "own checkpoints"]),
}


def _vllm(s) -> EngineConfig:
    spec, gaps = _pick(VLLM, s)
    supported = _supported(s, spec)
    sampling = {"temperature": s.temperature, "top_p": s.top_p, "seed": s.seed, "max_tokens": s.max_new_tokens}
    args = ['    model="<your-target-model>",']
    if spec:
        args.append(f"    speculative_config={json.dumps(spec)},")
    snippet = ("from vllm import LLM, SamplingParams\n\nllm = LLM(\n" + "\n".join(args) + "\n)\n"
               f"params = SamplingParams(temperature={s.temperature:g}, top_p={s.top_p:g}, seed={s.seed}, "
               f"max_tokens={s.max_new_tokens})\nout = llm.generate(prompts, params)")
    if spec:
        snippet += (f"\n\n# server: vllm serve <your-target-model> --speculative-config '{json.dumps(spec)}'")
    metrics = {
        "acceptance rate": "vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_draft_tokens_total",
        "mean acceptance length": "1 + vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_drafts_total",
        "TTFT": "time_to_first_token_ms (per-request metrics, --enable-per-request-metrics)",
        "TPOT": "mean_itl_ms (per-request metrics)",
        "throughput": "tokens_per_second (per-request metrics)",
    }
    return EngineConfig("vllm", TITLES["vllm"], supported, spec, sampling, snippet, metrics, gaps, DOCS["vllm"])


SGLANG = {
    "lookup": lambda s: ({"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": s.k},
                         [f"SGLang's NGRAM is CUDA-only; its n-gram sizes are its own settings, not our {NGRAMS}"]),
    # a chain: one candidate per step (topk 1), k steps, k + 1 tokens verified (the bonus position)
    "draft": lambda s: ({"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": _draft_path(s),
                         "--speculative-num-steps": s.k, "--speculative-eagle-topk": 1,
                         "--speculative-num-draft-tokens": s.k + 1}, []),
    "medusa": lambda s: ({}, ["Medusa heads: no equivalent algorithm; the nearest tree drafter is EAGLE "
                              "(--speculative-algorithm EAGLE with --speculative-eagle-topk > 1), which needs an "
                              "EAGLE draft"]),
    "early-exit": lambda s: ({}, ["early exit: no equivalent algorithm (EAGLE, EAGLE3, MTP, STANDALONE, NGRAM are "
                                  "offered)"]),
    "suffix": lambda s: ({}, ["suffix decoding: no equivalent algorithm; NGRAM is the nearest (it sees the request "
                              "only)"]),
    # EAGLE's dynamic tree: k levels, the top 3 candidates expanded per level, 8 nodes verified (our tree)
    "eagle": lambda s: ({"--speculative-algorithm": "EAGLE", "--speculative-draft-model-path": "<your-eagle-head>",
                         "--speculative-num-steps": s.k, "--speculative-eagle-topk": 3,
                         "--speculative-num-draft-tokens": 8}, []),
}


def _sglang(s) -> EngineConfig:
    spec, gaps = _pick(SGLANG, s)
    supported = _supported(s, spec)
    sampling = {"temperature": s.temperature, "top_p": s.top_p, "max_new_tokens": s.max_new_tokens}
    gaps.append(f"seed {s.seed}: not translated; check your SGLang version's sampling parameters for a per-request seed")
    flags = " ".join(f"{k} {v}" for k, v in spec.items())
    snippet = (f"python -m sglang.launch_server --model-path <your-target-model> {flags}".rstrip()
               + f'\n# per request: "sampling_params": {json.dumps(sampling)}')
    metrics = {
        "acceptance rate": NO + " as a single counter; (avg_spec_accept_length - 1) / k approximates it",
        "mean acceptance length": "avg_spec_accept_length (GET /server_info; cumulative over the server)",
        "TTFT": NO + " in the speculative docs; use the server's latency metrics or client-side timing",
        "TPOT": NO + " in the speculative docs; use the server's latency metrics or client-side timing",
        "throughput": "tokens/s from the server log or client-side timing",
    }
    return EngineConfig("sglang", TITLES["sglang"], supported, spec, sampling, snippet, metrics, gaps, DOCS["sglang"])


_TRT_NONE = lambda s: ({}, [f"{s.drafter}: no equivalent decoding config (Draft/Target, EAGLE 3, N-gram, MTP, "
                            "Medusa are offered)"])
TRTLLM = {   # "class": the decoding config's class, the rest its arguments
    "lookup": lambda s: ({"class": "NGramDecodingConfig", "max_draft_len": s.k,
                          "max_matching_ngram_size": LOOKUP_MAX_N}, []),
    "draft": lambda s: ({"class": "DraftTargetDecodingConfig", "max_draft_len": s.k,
                         "speculative_model": _draft_path(s)}, []),
    "medusa": lambda s: ({"class": "MedusaDecodingConfig", "max_draft_len": s.k,
                          "num_medusa_heads": "<heads in your checkpoint>",
                          "medusa_choices": "<your tree, as a list of paths>"},
                         ["Medusa runs on the TensorRT engine backend; our heads would need converting to its "
                          "checkpoint"]),
    "early-exit": _TRT_NONE,
    "suffix": _TRT_NONE,
    "eagle": lambda s: ({}, ["eagle: no equivalent for our head as it is; TensorRT-LLM's EAGLE 3 config needs an "
                             "EAGLE 3 checkpoint"]),
}


def _trtllm(s) -> EngineConfig:
    spec, gaps = _pick(TRTLLM, s)
    cls = spec.pop("class", "")
    supported = _supported(s, spec)
    sampling = {"temperature": s.temperature, "top_p": s.top_p, "seed": s.seed, "max_tokens": s.max_new_tokens}
    body = f"{cls}(" + ", ".join(f"{k}={v!r}" for k, v in spec.items()) + ")" if cls else "None"
    snippet = ("from tensorrt_llm import LLM, SamplingParams\n"
               + (f"from tensorrt_llm.llmapi import {cls}\n" if cls else "")
               + f"\nllm = LLM(\"<your-target-model>\", speculative_config={body})\n"
               f"params = SamplingParams(temperature={s.temperature:g}, top_p={s.top_p:g}, seed={s.seed}, "
               f"max_tokens={s.max_new_tokens})")
    metrics = {
        "acceptance rate": "accepted_draft_tokens / drafted_tokens (the definition its acceptance_rate_threshold uses)",
        "mean acceptance length": NO + " as a named metric; committed tokens / iterations from request stats",
        "TTFT": NO + " in the speculative docs; measure with the benchmark tool or client-side",
        "TPOT": NO + " in the speculative docs; measure with the benchmark tool or client-side",
        "throughput": "tokens/s from the benchmark tool or client-side timing",
    }
    return EngineConfig("tensorrt-llm", TITLES["tensorrt-llm"], supported, {"class": cls, **spec} if cls else {},
                        sampling, snippet, metrics, gaps, DOCS["tensorrt-llm"])


def _gguf(path: str) -> str:
    return path if path.endswith(".gguf") else path + ".gguf"


_LLAMA_NONE = lambda s: ({}, [f"{s.drafter}: no equivalent in llama-server"])
LLAMACPP = {
    "lookup": lambda s: ({"--spec-type": "ngram-simple", "--draft-max": s.k, "--spec-ngram-size-n": LOOKUP_MAX_N,
                          "--spec-ngram-size-m": s.k},
                         [f"ngram-simple matches one n-gram size; ours backs off from {LOOKUP_MAX_N} to "
                          f"{LOOKUP_MIN_N}"]),
    "draft": lambda s: ({"--model-draft": _gguf(_draft_path(s)), "--draft-max": s.k, "--draft-min": 0},
                        ["--draft-p-min stops drafting when the draft is unsure; our drafter always proposes k, so "
                         "leave it at its default or set it low to compare like with like"]),
    "medusa": lambda s: ({}, ["Medusa heads: no equivalent in llama-server"]),
    "early-exit": _LLAMA_NONE,
    "suffix": _LLAMA_NONE,
    "eagle": _LLAMA_NONE,
}


def _llamacpp(s) -> EngineConfig:
    spec, gaps = _pick(LLAMACPP, s)
    supported = _supported(s, spec)
    sampling = {"--temp": s.temperature, "--top-p": s.top_p, "--seed": s.seed, "--n-predict": s.max_new_tokens}
    flags = " ".join(f"{k} {v}" for k, v in spec.items())
    snippet = (f"llama-server -m <your-target-model>.gguf {flags} "
               + " ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in sampling.items()))
    metrics = {
        "acceptance rate": "draft acceptance rate (server log: accepted / generated draft tokens)",
        "mean acceptance length": NO + "; the log's #acc tokens and #calls give accepted drafts per call",
        "TTFT": "timings.prompt_ms in the response (prompt processing; close to TTFT)",
        "TPOT": "timings.predicted_per_token_ms in the response",
        "throughput": "timings.predicted_per_second in the response",
    }
    return EngineConfig("llama.cpp", TITLES["llama.cpp"], supported, spec, sampling, " ".join(snippet.split()),
                        metrics, gaps, DOCS["llama.cpp"])


_HF_NONE = lambda s: ({}, [f"{s.drafter}: no equivalent in generate()"])
TRANSFORMERS = {
    "lookup": lambda s: ({"prompt_lookup_num_tokens": s.k},
                         ["prompt lookup's n-gram size is fixed by transformers (max_matching_ngram_size), "
                          f"not our {NGRAMS} back-off"]),
    "draft": lambda s: ({"assistant_model": _draft_path(s), "num_assistant_tokens": s.k,
                         "num_assistant_tokens_schedule": "constant"}, []),
    "medusa": _HF_NONE,
    "suffix": _HF_NONE,
    "eagle": _HF_NONE,
    "early-exit": lambda s: ({}, ["early exit: no equivalent for our trained exit layer; transformers' "
                                  "self-speculative mode (assistant_early_exit) needs a model trained for early "
                                  "exit"]),
}


def _transformers(s) -> EngineConfig:
    spec, gaps = _pick(TRANSFORMERS, s)
    supported = _supported(s, spec)
    sampling = {"do_sample": s.temperature > 0, "max_new_tokens": s.max_new_tokens}
    if s.temperature > 0:
        sampling.update(temperature=s.temperature, top_p=s.top_p)
    args = ", ".join(f"{k}={v!r}" if k != "assistant_model" else "assistant_model=assistant"
                     for k, v in {**spec, **sampling}.items())
    snippet = ("from transformers import AutoModelForCausalLM, set_seed\n\n"
               "model = AutoModelForCausalLM.from_pretrained(\"<your-target-model>\")\n"
               + (f"assistant = AutoModelForCausalLM.from_pretrained({_draft_path(s)!r})\n"
                  if "assistant_model" in spec else "")
               + f"set_seed({s.seed})\nout = model.generate(**inputs, {args})")
    metrics = {m: NO + ": generate() does not report it; time it with a streamer" if m in ("TTFT", "TPOT", "throughput")
               else NO + ": generate() does not report drafted or accepted counts" for m in METRICS}
    return EngineConfig("transformers", TITLES["transformers"], supported, spec, sampling, snippet, metrics, gaps,
                        DOCS["transformers"])


for _table in (VLLM, SGLANG, TRTLLM, LLAMACPP, TRANSFORMERS):   # every drafter that drafts has its row
    assert set(_table) == set(drafters.SPECULATIVE), sorted(_table)


def translate(s) -> dict[str, EngineConfig]:
    """Settings (anything with drafter, draft_model, k, temperature, top_p, seed, max_new_tokens) ->
    {engine: EngineConfig}."""
    if drafters.entry(s.drafter).drafts and int(s.k) < 1:   # entry: DrafterUnavailable (a ValueError) if unknown
        raise ValueError(f"k must be at least 1 for drafter {s.drafter!r}, got {s.k}")
    return {e.engine: e for e in (_vllm(s), _sglang(s), _trtllm(s), _llamacpp(s), _transformers(s))}


def markdown(s) -> str:
    """The translation as Markdown, for the downloadable report."""
    out = []
    for e in translate(s).values():
        out.append(f"### {e.title}" + ("" if e.supported else " (draft source: no equivalent)"))
        out.append("```\n" + e.snippet + "\n```")
        out += [f"- {m}: {n}" for m, n in e.metrics.items()]
        out += [f"- Gap: {g}" for g in e.gaps]
        out.append("Docs: " + ", ".join(e.docs))
        out.append("")
    return "\n".join(out)


def link_label(url: str) -> str:
    """A docs link named by its site and page, so an engine's several links read differently:
    `docs.vllm.ai › n_gram`, `docs.vllm.ai › spec_decode (v0.9.1)`, `github.com › pull 10455`."""
    host, _, path = url.split("//", 1)[-1].partition("/")
    parts = [p for p in path.split("/") if p]
    page = parts[-1].rsplit(".", 1)[0] if parts else host
    if len(parts) > 1 and parts[-2] in ("pull", "issues"):
        page = f"{parts[-2].rstrip('s')} {page}"
    ver = next((p for p in parts[:-1] if p[:1] == "v" and p[1:2].isdigit() or p[:1].isdigit()), "")
    return f"{host} › {page}" + (f" ({ver})" if ver else "")


def link_labels(urls: list[str]) -> list[str]:
    """link_label for each, a repeated label told apart by its place in the list."""
    labels = [link_label(u) for u in urls]
    return [f"{x} ({labels[:i].count(x) + 1})" if labels.count(x) > 1 else x for i, x in enumerate(labels)]
