"""The examples at toy size: each command runs, writes its figure and JSON, and its numbers hold.

The full-size numbers (the defaults of each command) are in the JSONs the
commands write; these runs are small enough for a few seconds each.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.examples import lenet_digits, resnet, sin_regression
from meshbayes.layers import count_parameters


def _outputs(directory, name):
  assert (directory / f"{name}.png").stat().st_size > 10_000  # a drawn figure, not an empty one
  return json.loads((directory / f"{name}.json").read_text())


@pytest.mark.integration
def test_sin_regression_epistemic_band_widens_outside_the_data(tmp_path):
  results = sin_regression.main(["--output_dir", str(tmp_path), "--steps", "400",
                                 "--num_samples", "200", "--min_ratio", "1.5"])
  saved = _outputs(tmp_path, "sin_regression")
  assert saved["epistemic_ratio_outside_over_inside"] == pytest.approx(
      results["epistemic_ratio_outside_over_inside"])
  # The fit follows 10 sin(2 pi x) inside the data, to well under its amplitude.
  assert results["rmse_inside_vs_truth"] < 3.0
  # Loosely at toy size (2 at full size, in the JSON's "passes").
  assert results["epistemic_ratio_outside_over_inside"] > 1.5
  assert results["passes"]


def test_sin_regression_data_and_ratio():
  x, y = sin_regression.make_data(jax.random.key(0), 4096)
  residual = y - 10.0 * jnp.sin(2 * jnp.pi * x)
  assert float(jnp.std(residual)) == pytest.approx(sin_regression.NOISE_STDDEV, rel=0.05)
  assert float(jnp.min(x)) >= -0.5 and float(jnp.max(x)) <= 0.5
  grid = np.linspace(-1, 1, 201)
  assert sin_regression.epistemic_ratio(grid, np.where(np.abs(grid) > 0.5, 4.0, 2.0)) == 2.0


def test_lenet_deterministic_twin_has_the_same_weights():
  x = jnp.ones((1, 8, 8, 1))
  bayesian = count_parameters(lenet_digits.LeNet5(estimator="flipout").init(
      jax.random.key(0), x)["params"])
  deterministic = count_parameters(lenet_digits.LeNet5(estimator="deterministic").init(
      jax.random.key(0), x)["params"])
  # conv 5x5x1x6, 5x5x6x16, dense 64x120, 120x84, 84x10 with their biases
  kernels = 150 + 2400 + 7680 + 10080 + 840
  biases = 6 + 16 + 120 + 84 + 10
  assert deterministic.total == kernels + biases
  assert bayesian.bayesian_weights == kernels and bayesian.point_weights == biases
  assert bayesian.total == 2 * kernels + biases


@pytest.mark.integration
def test_lenet_digits_runs(tmp_path):
  results = lenet_digits.main(["--output_dir", str(tmp_path), "--epochs", "3",
                               "--num_samples", "4"])
  saved = _outputs(tmp_path, "lenet_digits")
  assert saved["num_train"] + saved["num_test"] == 1797
  for estimator in ("deterministic", "flipout"):
    metrics = saved[estimator]
    assert metrics["accuracy"] == pytest.approx(results[estimator]["accuracy"])
    assert metrics["accuracy"] > 0.5  # ten classes: chance is 0.1
    assert 0.0 <= metrics["ece"] < 0.5
    assert sum(metrics["reliability"]["bin_count"]) == saved["num_test"]
    assert metrics["noise_auroc"] > 0.6  # noise already more uncertain than digits
  assert 0.0 <= saved["flipout"]["noise_auroc_mutual_information"] <= 1.0
  assert "noise_auroc_mutual_information" not in saved["deterministic"]


def test_resnet50_parameter_counts():
  deterministic = resnet.parameter_counts(resnet.ResNet(estimator="deterministic"))
  assert deterministic["total"] == resnet.TORCHVISION_RESNET50_PARAMETERS == 25_557_032
  assert deterministic["batch_norm_statistics"] == 53_120  # running means and variances
  bayesian = resnet.parameter_counts(resnet.ResNet(estimator="flipout"))
  batch_norm, fc_kernel, fc_bias = 53_120, 2048 * 1000, 1000
  conv_kernels = 25_557_032 - batch_norm - fc_kernel - fc_bias
  assert bayesian == {"total": 2 * conv_kernels + batch_norm + 2 * fc_kernel + fc_bias,
                      "bayesian_weights": conv_kernels + fc_kernel,
                      "point_weights": batch_norm + fc_bias,
                      "batch_norm_statistics": 53_120}
  assert bayesian["total"] == 51_059_944
  assert bayesian["bayesian_weights"] + bayesian["point_weights"] == 25_557_032


@pytest.mark.integration
def test_resnet_small_runs(tmp_path):
  resnet.main(["--output_dir", str(tmp_path), "--epochs", "4", "--stage_sizes", "1",
               "--width", "8", "--num_samples", "4"])
  saved = _outputs(tmp_path, "resnet")
  assert saved["resnet50"]["deterministic_matches_torchvision"]
  for estimator in ("deterministic", "flipout"):
    assert saved["small_resnet_digits"][estimator]["accuracy"] > 0.3  # chance is 0.1
  small = saved["small_resnet_digits"]
  assert small["flipout"]["bayesian_weights"] + small["flipout"]["point_weights"] == (
      small["deterministic"]["total"])
