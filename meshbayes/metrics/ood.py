"""Out-of-distribution detection: AUROC and FPR at 95% TPR of uncertainty scores, higher
meaning "more likely out of distribution".
"""

from __future__ import annotations

import numpy as np


def auroc(in_domain_scores, out_of_domain_scores) -> float:
  """P(OOD score > in-domain score) for a random pair, ties counting 1/2.

  This is the area under the ROC curve, computed as the Mann-Whitney U
  statistic from average ranks: ``O(n log n)``, no pairwise comparisons.

  Args:
    in_domain_scores: ``(n,)`` scores of in-distribution inputs.
    out_of_domain_scores: ``(m,)`` scores of out-of-distribution inputs.

  Returns:
    AUROC in ``[0, 1]``: 1 when every OOD score exceeds every in-domain one,
    0.5 for indistinguishable scores.

  >>> auroc([0.1, 0.2, 0.3], [0.3, 0.4])
  0.9166666666666666
  """
  in_domain = np.asarray(in_domain_scores, np.float64).reshape(-1)
  out_of_domain = np.asarray(out_of_domain_scores, np.float64).reshape(-1)
  if in_domain.size == 0 or out_of_domain.size == 0:
    raise ValueError("auroc needs at least one in-domain and one out-of-domain score")
  scores = np.concatenate([in_domain, out_of_domain])
  if np.isnan(scores).any():
    raise ValueError("auroc: scores contain NaN")
  # Average 1-based rank of each distinct value: tied scores share it.
  _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
  average_rank = np.cumsum(counts) - (counts - 1) / 2.0
  ood_rank_sum = np.sum(average_rank[inverse[in_domain.size:]])
  m, n = out_of_domain.size, in_domain.size
  u = ood_rank_sum - m * (m + 1) / 2.0  # pairs (ood, in) with ood > in, ties 1/2
  return float(u / (m * n))


def fpr_at_tpr(in_domain_scores, out_of_domain_scores, tpr: float = 0.95) -> float:
  """False-positive rate at a true-positive rate: OOD inputs are the positives.

  The threshold is the highest score that flags at least ``tpr`` of the OOD
  inputs (score >= threshold); the result is the fraction of in-domain inputs
  it flags too. 0 is perfect, and indistinguishable scores give about ``tpr``.

  >>> fpr_at_tpr([0.1, 0.2, 0.3, 0.9], [0.25, 0.4, 0.5, 0.6])
  0.5
  """
  in_domain = np.asarray(in_domain_scores, np.float64).reshape(-1)
  out_of_domain = np.sort(np.asarray(out_of_domain_scores, np.float64).reshape(-1))[::-1]
  if in_domain.size == 0 or out_of_domain.size == 0:
    raise ValueError("fpr_at_tpr needs at least one in-domain and one out-of-domain score")
  if not 0 < tpr <= 1:
    raise ValueError(f"fpr_at_tpr: tpr={tpr!r} must be in (0, 1]")
  threshold = out_of_domain[int(np.ceil(tpr * out_of_domain.size)) - 1]
  return float(np.mean(in_domain >= threshold))
