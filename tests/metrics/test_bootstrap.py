"""Bootstrap intervals against known sampling distributions, and paired differences."""

import numpy as np
import pytest

from meshbayes.metrics import bootstrap


def test_the_interval_of_a_proportion_is_its_normal_approximation():
  """400 items, 30% ones: the resampled mean's spread is sqrt(p (1 - p) / n), so the 95%
  interval is p +- 1.96 of it (within the resamples' own noise)."""
  data = np.r_[np.ones(120), np.zeros(280)]
  interval = bootstrap.bootstrap(lambda i: {"mean": data[i].mean()}, [400],
                                 num_resamples=4000)["mean"]
  half_width = 1.96 * np.sqrt(0.3 * 0.7 / 400)
  assert interval.estimate == 0.3
  assert interval.low == pytest.approx(0.3 - half_width, abs=0.006)
  assert interval.high == pytest.approx(0.3 + half_width, abs=0.006)


def test_coverage_of_the_mean_of_normal_samples():
  """Over 300 data sets of 80 normals, the 90% interval holds the true mean about 90% of
  the time (percentile intervals run a little short at this size)."""
  rng = np.random.default_rng(0)
  covered = 0
  for k in range(300):
    data = rng.normal(1.0, 2.0, size=80)
    interval = bootstrap.bootstrap(lambda i: {"mean": data[i].mean()}, [80], num_resamples=400,
                                   seed=k, level=0.9)["mean"]
    covered += interval.low <= 1.0 <= interval.high
  assert 0.84 <= covered / 300 <= 0.95


def test_groups_are_resampled_within_themselves():
  """Two groups (in- and out-of-distribution): each resample keeps their sizes."""
  inside, outside = np.zeros(30), np.ones(10)
  interval = bootstrap.bootstrap(
      lambda i, o: {"share": len(o) / (len(i) + len(o)), "out": outside[o].mean()}, [30, 10])
  assert interval["share"].low == interval["share"].high == 0.25
  assert interval["out"].estimate == interval["out"].low == 1.0


def test_paired_differences_cancel_what_both_share():
  """Two scores of the same items, the second the first plus small noise: the paired
  difference's interval is much narrower than the unpaired intervals, and it finds a
  shift of 0.05 that the separate intervals cannot tell apart."""
  rng = np.random.default_rng(1)
  hardness = rng.normal(0, 1, size=500)
  a = hardness + 0.05 + rng.normal(0, 0.1, size=500)
  b = hardness
  mean = lambda x: (lambda i: {"mean": x[i].mean()})
  separate = [bootstrap.bootstrap(mean(x), [500])["mean"] for x in (a, b)]
  assert separate[0].low < separate[1].high  # the separate intervals overlap
  paired = bootstrap.paired_bootstrap(mean(a), mean(b), [500])["mean"]
  assert paired.low > 0 and paired.high - paired.low < 0.05
  assert bootstrap.verdict(paired, higher_is_better=True) == "better"
  assert bootstrap.verdict(paired, higher_is_better=False) == "worse"
  same = bootstrap.paired_bootstrap(mean(a), mean(a), [500])["mean"]
  assert same.low == same.high == 0.0
  assert bootstrap.verdict(same, higher_is_better=True) == "within noise"


def test_nan_resamples_are_left_out_and_bad_settings_are_one_line():
  data = np.r_[np.zeros(3), 1.0]  # a resample without the single 1 has no ratio
  ratio = lambda i: {"r": 1.0 / data[i].sum() if data[i].sum() else np.nan}
  interval = bootstrap.bootstrap(ratio, [4], num_resamples=200)["r"]
  assert np.isfinite(interval.low) and np.isfinite(interval.high)
  with pytest.raises(ValueError, match=r"group sizes \[0\] must be positive ints"):
    bootstrap.bootstrap(ratio, [0])
  with pytest.raises(ValueError, match="num_resamples=0 must be a positive int"):
    bootstrap.bootstrap(ratio, [4], num_resamples=0)
  with pytest.raises(ValueError, match="num_resamples=True must be a positive int"):
    bootstrap.bootstrap(ratio, [4], num_resamples=True)
