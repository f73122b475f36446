"""Chi-square goodness of fit for discrete laws, with the pooling and zero-probability rule tests share."""
from __future__ import annotations

import numpy as np
from scipy.stats import chisquare

ALPHA = 1e-3  # reject exactness below this p-value


def gof(counts, probs) -> float:
    """Chi-square p-value of counts against probs. An outcome of probability zero that occurs is an
    outright rejection (p-value 0); cells expected below 5 are pooled so the chi-square law holds."""
    counts, probs = np.asarray(counts, float).ravel(), np.asarray(probs, float).ravel()
    probs = probs / probs.sum()
    if counts[probs == 0].sum() > 0:
        return 0.0
    exp = probs * counts.sum()
    keep = exp >= 5
    obs_k, exp_k = list(counts[keep]), list(exp[keep])
    if (~keep & (probs > 0)).any():
        obs_k.append(counts[~keep].sum())
        exp_k.append(exp[~keep].sum())
    return float(chisquare(obs_k, exp_k).pvalue)
