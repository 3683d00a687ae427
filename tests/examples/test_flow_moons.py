"""The flow_moons example at toy size: it runs, writes its figure and JSON, and learns.

Full-size numbers (the command's defaults) are in the JSON the command writes.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorflow_probability.substrates import jax as tfp

from meshbayes.examples import flow_moons


@pytest.mark.integration
def test_flow_moons_beats_the_base_gaussian(tmp_path):
  results = flow_moons.main(["--output_dir", str(tmp_path), "--num_points", "400",
                             "--num_layers", "2", "--hidden", "16", "16", "--steps", "300",
                             "--num_samples", "400"])
  assert (tmp_path / "flow_moons.png").stat().st_size > 10_000
  saved = json.loads((tmp_path / "flow_moons.json").read_text())
  scores = results["log_likelihood_standardized"]
  assert saved["log_likelihood_standardized"] == pytest.approx(scores)
  # The base N(0, I) on standardized data: -log(2 pi) - E|z|^2 / 2, about -2.84 nats.
  assert scores["base_gaussian_test"] == pytest.approx(-np.log(2 * np.pi) - 1, abs=0.1)
  # 300 steps of a 2-layer flow already fit the moons better than the Gaussian it started as
  # (0.46 nats per point measured; a full-size run gains about 2).
  assert scores["flow_test"] > scores["base_gaussian_test"] + 0.25
  # The data coordinates differ by the standardization's log-Jacobian, the same for every model.
  shift = {k: results["log_likelihood_data_coordinates"][k] - v for k, v in scores.items()}
  assert max(shift.values()) - min(shift.values()) < 1e-9
  # Samples are standardized-scale moons: mean near 0 and spread near 1.
  assert np.all(np.abs(results["sample_mean"]) < 0.3)
  assert np.all(np.abs(np.asarray(results["sample_std"]) - 1) < 0.3)


def test_untrained_flow_is_the_base_gaussian():
  # Zero-initialized output kernels and biases: the identity, so the base's density exactly.
  model = flow_moons.moons_flow(num_layers=3, hidden=(8,))
  base = flow_moons.base_distribution()
  variables = model.init(jax.random.key(0), base)
  points = jax.random.normal(jax.random.key(1), (7, 2)) * 2
  np.testing.assert_allclose(model.apply(variables, base).log_prob(points),
                             base.log_prob(points), atol=1e-6)
  train, test, mean, std = flow_moons.load_moons(200, seed=0)
  assert train.shape == (160, 2) and test.shape == (40, 2)
  np.testing.assert_allclose(train.std(0), 1.0, atol=1e-5)
  dist = model.apply(variables, base)
  # TFP's transformed distribution; its non-pytree class, as the bijector holds closures.
  # One transformed distribution for the whole flow (not one per layer), over the base.
  assert isinstance(dist, tfp.distributions.Distribution) and dist.distribution is base
  assert jnp.all(jnp.isfinite(model.apply(variables, points)))
