"""specdec: exact speculative decoding on real models, step by step.

Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (ICML 2023);
Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023).
"""
from .errors import InputError
from .sampling import SamplingParams
from .models import LM, ModelError, IncompatibleModels, load, check_compatible
from .engine import decode, run
from .drafters import make as make_drafter, NAMES as DRAFTERS, DrafterUnavailable

__all__ = ["InputError", "SamplingParams", "LM", "ModelError", "IncompatibleModels", "load",
           "check_compatible", "decode", "run", "make_drafter", "DRAFTERS", "DrafterUnavailable"]
