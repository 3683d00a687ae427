"""AUROC against brute-force pair counting."""

import numpy as np
import pytest

from meshbayes.metrics import auroc


def brute_force_auroc(in_domain, out_of_domain):
  wins = 0.0
  for o in out_of_domain:
    for i in in_domain:
      wins += 1.0 if o > i else 0.5 if o == i else 0.0
  return wins / (len(in_domain) * len(out_of_domain))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_matches_pair_counting_with_ties(seed):
  rng = np.random.default_rng(seed)
  in_domain = rng.integers(0, 6, size=37).astype(float)  # few values: many ties
  out_of_domain = rng.integers(2, 8, size=23).astype(float)
  assert auroc(in_domain, out_of_domain) == pytest.approx(
      brute_force_auroc(in_domain, out_of_domain), abs=1e-12)
  continuous_in, continuous_out = rng.normal(size=50), rng.normal(0.5, size=30)
  assert auroc(continuous_in, continuous_out) == pytest.approx(
      brute_force_auroc(continuous_in, continuous_out), abs=1e-12)


def test_auroc_extremes():
  assert auroc([0.1, 0.2, 0.3], [0.4, 0.5]) == 1.0
  assert auroc([0.4, 0.5], [0.1, 0.2, 0.3]) == 0.0
  assert auroc([0.7, 0.7, 0.7], [0.7, 0.7]) == 0.5
  assert auroc([1.0, 2.0], [1.0, 2.0]) == 0.5


def test_auroc_rejects_empty_and_nan():
  with pytest.raises(ValueError, match="at least one"):
    auroc([], [1.0])
  with pytest.raises(ValueError, match="NaN"):
    auroc([np.nan], [1.0])
