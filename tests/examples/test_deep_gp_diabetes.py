"""The deep_gp_diabetes example at toy size: it runs, writes its figure and JSON, and learns.

Full-size numbers (the command's defaults) are in the JSON the command writes and in
docs/results/2026-11-28-layer-examples.md.
"""

import json

import jax
import numpy as np
import pytest

from meshbayes.examples import deep_gp_diabetes


@pytest.mark.integration
@pytest.mark.slow  # four models compiled: about 23 s of CPU at this size
def test_deep_gp_diabetes_models_beat_the_training_mean(tmp_path):
  # Three layers with hidden width 4 (not the 10 features): the first hidden layer's mean
  # function is the inputs' principal directions, the second's the identity.
  results = deep_gp_diabetes.main(["--output_dir", str(tmp_path), "--steps", "100",
                                   "--num_inducing", "16", "--hidden_units", "4",
                                   "--mlp_hidden", "16", "--num_samples", "8"])
  assert (tmp_path / "deep_gp_diabetes.png").stat().st_size > 10_000
  saved = json.loads((tmp_path / "deep_gp_diabetes.json").read_text())
  assert saved["num_train"] == 354 and saved["num_test"] == 88
  baseline = results["training_mean"]
  # The training mean's test RMSE is about the target's standard deviation (77 in its units).
  assert baseline["rmse"] == pytest.approx(saved["target_std"], rel=0.05)
  for name in deep_gp_diabetes.MODELS:
    assert saved[name]["rmse"] == pytest.approx(results[name]["rmse"])
    # 100 steps: every model already explains part of the variance (measured RMSE 52 to 62,
    # log-likelihood -5.65 to -5.51 against 77.2 and -5.76).
    assert results[name]["rmse"] < 0.9 * baseline["rmse"], name
    assert results[name]["log_likelihood"] > baseline["log_likelihood"] + 0.05, name
    curve = saved["loss_curves_every_20_steps"][name]
    assert len(curve) == 6 and curve[-1] < curve[0] and np.all(np.isfinite(curve)), name


def test_one_sparse_gp_layer_learns_in_a_few_steps():
  """The example's training and scoring path for its cheapest model (the full comparison of
  the four models above compiles each and is marked slow)."""
  config = deep_gp_diabetes.DeepGPDiabetesConfig(num_inducing=8, steps=150)
  data = deep_gp_diabetes.load_diabetes(config.test_fraction, config.seed)
  model = deep_gp_diabetes.deep_gp(data["x_train"], 1, config)
  params, curve, _ = deep_gp_diabetes.train(model, data, jax.random.key(0), config)
  means, variances = deep_gp_diabetes.predict(model, params, data["x_test"], jax.random.key(1), 1)
  scores = deep_gp_diabetes.scores(means, variances, data["y_test"], data["y_std"])
  baseline = deep_gp_diabetes.scores(np.zeros_like(means), np.ones_like(means), data["y_test"],
                                     data["y_std"])
  assert curve[-1] < curve[0]
  # Measured after 150 steps: RMSE 56.4 against 77.2, log-likelihood -5.49 against -5.76.
  assert scores["rmse"] < 0.9 * baseline["rmse"]
  assert scores["log_likelihood"] > baseline["log_likelihood"] + 0.05
