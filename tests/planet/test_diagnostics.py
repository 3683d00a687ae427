"""The shared-data fit and the posterior's stddevs against its prior."""

import dataclasses
import math

import jax
import numpy as np
import pytest

from meshbayes.planet import diagnostics
from meshbayes.planet.agent import Agent
from meshbayes.planet.config import PRESETS
from meshbayes.planet.training import train

TOY = PRESETS["toy"]
BAYESIAN = dataclasses.replace(TOY, estimator="reparameterization", seed=3)


@pytest.mark.parametrize("prior", ["fan_in_scaled", "standard_normal"])
def test_stddev_ratios_at_initialization(prior):
  config = dataclasses.replace(BAYESIAN, transition_prior=prior, transition_stddev_ratio=0.2)
  params, _ = Agent(config).init(jax.random.key(0))
  ratios = diagnostics.stddev_ratios(params, prior == "fan_in_scaled")
  assert sorted(ratios) == ["rssm/transition_hidden", "rssm/transition_input",
                            "rssm/transition_stats"]
  # The posterior starts at 0.2 / sqrt(fan_in); the fan-in prior's stddev is 1 / sqrt(fan_in).
  fan_in = {"rssm/transition_input": TOY.stoch_size + 1, "rssm/transition_hidden":
            TOY.deter_size, "rssm/transition_stats": TOY.hidden_size}
  for layer, ratio in ratios.items():
    want = 0.2 if prior == "fan_in_scaled" else 0.2 / math.sqrt(fan_in[layer])
    assert ratio == pytest.approx(want, rel=1e-5)
  planet, _ = Agent(TOY).init(jax.random.key(0))
  assert diagnostics.stddev_ratios(planet, True) == {}


def test_shared_fit_averages_the_samples_and_a_deterministic_model_draws_none():
  calls = []

  def evaluate(key, deterministic):
    calls.append(deterministic)
    value = 1.0 if deterministic else float(jax.random.uniform(key))
    return {name: value for name in diagnostics.FIT_TERMS}

  key = jax.random.key(7)
  fit = diagnostics.shared_fit(evaluate, True, key, samples=4)
  want = np.mean([float(jax.random.uniform(jax.random.fold_in(key, i))) for i in range(4)])
  assert fit["mean"] == {name: 1.0 for name in diagnostics.FIT_TERMS}
  assert fit["sampled"]["image_nll"] == pytest.approx(want, abs=1e-12)
  assert calls == [True] + [False] * 4
  calls.clear()
  fit = diagnostics.shared_fit(evaluate, False, key, samples=4)
  assert calls == [True] and fit["sampled"] == fit["mean"]


@pytest.fixture(scope="module")
def runs():
  """A toy Bayesian run and PlaNet's of the same seed."""
  return train(BAYESIAN), train(dataclasses.replace(BAYESIAN, estimator="deterministic"))


def test_runs_record_the_fit_on_the_probe_episodes_and_the_stddev_ratios(runs):
  bayesian, planet = runs
  entries = TOY.seed_episodes + TOY.train_episodes
  for record in runs:
    assert len(record["curve"]["shared_fit"]) == len(record["curve"]["stddev_ratio"]) == entries
    # The last entry is measured on the final parameters, with the same latent noise.
    assert record["curve"]["shared_fit"][-1] == record["shared_fit"]["mean"]
    fit = record["shared_fit"]["mean"]
    assert set(fit) == set(diagnostics.FIT_TERMS)
    assert 0 < fit["image_nll"] < 0.5 * TOY.image_size ** 2 and fit["latent_kl"] > 0
  assert planet["shared_fit"]["sampled"] == planet["shared_fit"]["mean"]
  assert bayesian["shared_fit"]["sampled"] != bayesian["shared_fit"]["mean"]
  assert bayesian["shared_fit"]["samples"] == diagnostics.SHARED_FIT_SAMPLES
  # Seed episodes are collected before any step: the ratios there are the initial 0.1.
  first = bayesian["curve"]["stddev_ratio"][0]
  assert all(r == pytest.approx(TOY.transition_stddev_ratio, rel=1e-5) for r in first.values())
  assert bayesian["final_stddev_ratio"] == bayesian["curve"]["stddev_ratio"][-1] != first
  assert planet["final_stddev_ratio"] == {}
  # Both agents of a seed are scored on the same episodes: at initialization (the same
  # initial means, the Bayesian one at its posterior mean) their fits are equal.
  assert bayesian["curve"]["shared_fit"][0] == planet["curve"]["shared_fit"][0]
