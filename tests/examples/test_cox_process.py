"""The cox_process example at toy size: it runs, writes its figure and JSON, learns the intensity.

Full-size numbers (the command's defaults) are in the JSON the command writes and in
docs/results/2026-11-28-layer-examples.md.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.examples import cox_process
from meshbayes.layers import PoissonProcessDistribution

TOY = ["--steps", "150", "--num_samples", "16", "--grid", "30", "--coal_inducing", "8",
       "--inducing_per_axis", "4", "--quadrature_per_axis", "12", "--coal_quadrature", "32"]


@pytest.mark.integration
def test_cox_process_beats_the_constant_rate_at_toy_size(tmp_path):
  results = cox_process.main(["--output_dir", str(tmp_path)] + TOY)
  assert (tmp_path / "cox_process.png").stat().st_size > 10_000
  saved = json.loads((tmp_path / "cox_process.json").read_text())
  for name in cox_process.DATASETS:
    curve = saved[name]["negative_elbo_every_20_steps"]
    assert len(curve) == 9 and np.all(np.isfinite(curve)) and curve[-1] < curve[0], name
    held_out = saved[name]["held_out_log_likelihood_per_test_point"]
    assert held_out == results[name]["held_out_log_likelihood_per_test_point"]
    # Measured at this size: 3.82 against 3.64 on coal, 5.02 against 4.58 in 2-D (nats per
    # test point): a model whose rate ignored the data would equal the constant rate.
    assert held_out["cox_process"] > held_out["constant_rate"] + 0.05, name
  synthetic = saved["synthetic_2d"]
  assert synthetic["num_train"] + synthetic["num_test"] == synthetic["num_points"]
  # Measured 0.50 against the constant rate's 0.77 (relative L2 error of the intensity).
  assert synthetic["relative_l2_error"]["cox_process"] < (
      0.85 * synthetic["relative_l2_error"]["constant_rate"])
  assert 0.0 <= synthetic["coverage_90"] <= 1.0


def test_patterns_and_their_split():
  coal = cox_process.load_pattern("coal", seed=0)
  points = np.concatenate([coal["train"], coal["test"]])
  assert points.shape == (191, 1) and points.min() > 0.0 and points.max() < 1.0
  # A p = 0.5 thinning: the train half's size is Binomial(191, 0.5), sd 6.9.
  assert abs(len(coal["train"]) - 95.5) < 4.5 * math.sqrt(191 / 4)
  synthetic = cox_process.load_pattern("synthetic_2d", seed=0)
  count = len(synthetic["train"]) + len(synthetic["test"])
  expected = float(PoissonProcessDistribution(cox_process.synthetic_intensity, low=(0.0, 0.0),
                                              high=(1.0, 1.0)).integrated_rate())
  assert abs(count - expected) < 4.5 * math.sqrt(expected)
  # The thinning sampler's bound in load_pattern is above the truth's maximum.
  grid = cox_process.grid_midpoints(200, 2)
  assert float(jnp.max(cox_process.synthetic_intensity(jnp.asarray(grid)))) < 3100.0


@pytest.mark.parametrize("kwargs, message", [
    ({"datasets": ("coal", "mnist")}, "datasets="),
    ({"steps": 0}, "steps=0"),
    ({"learning_rate": -1.0}, "learning_rate=-1.0"),
])
def test_bad_config_raises_one_clear_line(kwargs, message):
  with pytest.raises(ValueError, match=message):
    cox_process.CoxProcessConfig(**kwargs)
