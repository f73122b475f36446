"""sampling.probs: temperature, top-k and top-p against hand computations and transformers' own warpers;
SamplingParams' range checks; sample() draws from the law it is given."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdec_core import InputError, SamplingParams
from specdec_core.sampling import argmax, probs, sample

P4 = torch.tensor([0.4, 0.3, 0.2, 0.1])


def close(a, b):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=torch.float32), atol=1e-6, rtol=1e-5)


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [5.0, 0.0, 0.0, 0.0]])
    close(probs(logits, SamplingParams()), [[0, 1, 0, 0], [1, 0, 0, 0]])
    # top-k / top-p do not change a greedy pick
    close(probs(logits, SamplingParams(top_k=2, top_p=0.1)), [[0, 1, 0, 0], [1, 0, 0, 0]])
    # bf16 logits (the forward's): picked as they are, the same one-hot in fp32 as from their fp32 copy
    x = torch.randn(19, 49152, generator=torch.Generator().manual_seed(0)).bfloat16()
    x[3, [7, 40000]] = x[3].max()                                                # a tie: the first wins
    got = probs(x, SamplingParams())
    assert got.dtype == torch.float32 and torch.equal(got, probs(x.float(), SamplingParams()))


@pytest.mark.parametrize("V", [49152, 32000, 1000, 97, 5])
def test_argmax_is_torchs_first_maximum(V):
    """The blocked argmax gives torch.argmax's index on every row: ties (the first wins, also across blocks), a
    maximum in the last block, -inf rows, NaN (ranked largest, as torch does), bf16 logits' many equal values."""
    g = torch.Generator().manual_seed(V)
    x = torch.randn(24, V, generator=g).bfloat16().float()                       # coarse: exact ties abound
    x[1, :] = 0.0                                                                # all tied: index 0
    x[2, -1] = 99.0                                                              # the very last entry
    x[3, [V // 3, V - 2]] = 77.0                                                 # a tie in two blocks
    x[4, :] = float("-inf")
    x[5, V // 2] = float("nan")
    x[6, [V - 1, V // 4]] = float("nan")                                         # the first NaN wins
    x[7, V // 7] = float("inf")
    for t in (x, x.bfloat16(), x[0], x.view(4, 6, V), x[:0]):
        assert torch.equal(argmax(t), t.argmax(-1)), t.shape
    assert int(argmax(torch.tensor(3.0))) == 0


def test_temperature():
    logits = P4.log()
    close(probs(logits, SamplingParams(temperature=1.0)), P4)
    # T = 0.5 squares the probabilities before renormalising
    close(probs(logits, SamplingParams(temperature=0.5)), P4 ** 2 / (P4 ** 2).sum())
    close(probs(logits, SamplingParams(temperature=2.0)), P4.sqrt() / P4.sqrt().sum())


def test_top_k_by_hand():
    logits = P4.log()[[2, 0, 3, 1]]                      # unsorted: [0.2, 0.4, 0.1, 0.3]
    close(probs(logits, SamplingParams(temperature=1.0, top_k=2)), [0, 4 / 7, 0, 3 / 7])
    close(probs(logits, SamplingParams(temperature=1.0, top_k=1)), [0, 1, 0, 0])
    close(probs(logits, SamplingParams(temperature=1.0, top_k=4)), [0.2, 0.4, 0.1, 0.3])
    close(probs(logits, SamplingParams(temperature=1.0, top_k=99)), [0.2, 0.4, 0.1, 0.3])


def test_top_p_by_hand():
    logits = torch.tensor([0.15, 0.5, 0.05, 0.3]).log()
    # keep a token while the mass ranked before it is below top_p: 0.5 | 0.3 | 0.15 | 0.05
    close(probs(logits, SamplingParams(temperature=1.0, top_p=0.3)), [0, 1, 0, 0])
    close(probs(logits, SamplingParams(temperature=1.0, top_p=0.75)), [0, 0.625, 0, 0.375])
    close(probs(logits, SamplingParams(temperature=1.0, top_p=0.9)), [0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95])
    close(probs(logits, SamplingParams(temperature=1.0, top_p=0.99)), [0.15, 0.5, 0.05, 0.3])


def test_temperature_then_top_k_then_top_p_by_hand():
    # temperature first: T = 0.5 gives [16, 9, 4, 1] / 30
    # mass ranked before each token: 0, 16/30, 25/30, 29/30
    close(probs(P4.log(), SamplingParams(temperature=0.5, top_p=0.5)), [1, 0, 0, 0])
    close(probs(P4.log(), SamplingParams(temperature=0.5, top_p=0.6)), [16 / 25, 9 / 25, 0, 0])
    close(probs(P4.log(), SamplingParams(temperature=0.5, top_p=0.8)), [16 / 25, 9 / 25, 0, 0])
    close(probs(P4.log(), SamplingParams(temperature=0.5, top_p=0.85)), [16 / 29, 9 / 29, 4 / 29, 0])
    close(probs(P4.log(), SamplingParams(temperature=0.5, top_k=3)), [16 / 29, 9 / 29, 4 / 29, 0])
    # top-k, then top-p measured on the renormalised top-k law: [4, 3, 2] / 9, mass before 2/9 is 7/9
    close(probs(P4.log(), SamplingParams(temperature=1.0, top_k=3, top_p=0.75)), [4 / 7, 3 / 7, 0, 0])
    close(probs(P4.log(), SamplingParams(temperature=1.0, top_k=3, top_p=0.8)), [4 / 9, 3 / 9, 2 / 9, 0])


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.9), (1.3, 5, 1.0), (0.8, 20, 0.8), (1.0, 3, 0.5)])
def test_matches_transformers_warpers(temperature, top_k, top_p):
    """Same law as transformers' generate() with the same settings (random logits: no boundary ties)."""
    logits = 3 * torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    got = probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    close(got, torch.softmax(ref, -1))


def test_shapes_and_dtype():
    logits = torch.randn(2, 3, 11, dtype=torch.bfloat16)
    for sp in (SamplingParams(), SamplingParams(temperature=0.9, top_k=4, top_p=0.7)):
        out = probs(logits, sp)
        assert out.shape == (2, 3, 11) and out.dtype == torch.float32
        close(out.sum(-1), torch.ones(2, 3))
    assert sample(torch.softmax(torch.randn(2, 3, 11), -1), None).shape == (2, 3)


def test_sample_follows_p():
    p = torch.tensor([0.5, 0.0, 0.25, 0.125, 0.125])
    gen = torch.Generator().manual_seed(0)
    draws = sample(p.expand(50_000, -1), gen).numpy()
    counts = np.bincount(draws, minlength=5)
    assert counts[1] == 0
    keep = p.numpy() > 0
    assert chisquare(counts[keep], p.numpy()[keep] * draws.size).pvalue > 1e-3


@pytest.mark.parametrize("kw,what", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=5.01), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(top_p=0.0), "top-p"), (dict(top_p=1.01), "top-p"), (dict(top_p=-0.5), "top-p"),
    (dict(top_k=-1), "top-k"),
])
def test_bad_params(kw, what):
    with pytest.raises(InputError, match=what):
        SamplingParams(**kw)


def test_good_params_edges():
    SamplingParams(temperature=0.0)
    SamplingParams(temperature=5.0, top_p=1.0, top_k=0)
    SamplingParams(top_p=1e-6, top_k=1)
    assert SamplingParams().greedy and not SamplingParams(temperature=0.1).greedy
