"""The world model: Bayesian only in the transition, its KL, one weight sample per rollout."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from meshbayes.planet import rollout
from meshbayes.planet.config import PRESETS, PlanetConfig
from meshbayes.planet.model import world_model

TOY = PRESETS["toy"]
TRANSITION = ("transition_input", "transition_hidden", "transition_stats")


@functools.lru_cache(maxsize=None)  # one compile per estimator for the module
def init(estimator):
  config = dataclasses.replace(TOY, estimator=estimator)
  model = world_model(config)
  s = config.image_size
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, s, s, 1)),
                               jnp.zeros((1, 1)))["params"]
  return model, params


def test_only_the_transition_dense_layers_are_bayesian():
  _, deterministic = init("deterministic")
  _, bayesian = init("reparameterization")
  det_paths = set(traverse_util.flatten_dict(deterministic))
  bayes_paths = set(traverse_util.flatten_dict(bayesian))
  changed = {p for p in det_paths ^ bayes_paths}
  assert changed == ({("rssm", layer, "kernel") for layer in TRANSITION}
                     | {("rssm", layer, f"kernel_{part}") for layer in TRANSITION
                        for part in ("loc", "scale")})


@pytest.mark.parametrize("prior", ["standard_normal", "fan_in_scaled"])
def test_weight_kl_is_the_closed_form_for_bayesian_and_zero_for_deterministic(prior):
  model, params = init("deterministic")
  assert float(rollout.weight_kl(model, params)) == 0.0
  config = dataclasses.replace(TOY, estimator="reparameterization", transition_prior=prior)
  model = world_model(config)
  s = config.image_size
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, s, s, 1)),
                               jnp.zeros((1, 1)))["params"]
  want = 0.0
  for layer in TRANSITION:
    loc = np.asarray(params["rssm"][layer]["kernel_loc"], np.float64)
    std = np.log1p(np.exp(np.asarray(params["rssm"][layer]["kernel_scale"], np.float64)))
    prior_std = 1.0 if prior == "standard_normal" else 1.0 / np.sqrt(loc.shape[0])
    # KL(N(loc, std) || N(0, prior_std)), elementwise
    want += np.sum(np.log(prior_std / std) + (std ** 2 + loc ** 2) / (2 * prior_std ** 2) - 0.5)
  got = float(rollout.weight_kl(model, params))
  assert got > 100.0
  assert got == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("estimator", ["deterministic", "reparameterization"])
def test_one_weight_sample_per_rollout(estimator):
  model, params = init(estimator)
  initial = model.apply({"params": params}, (2,), method=model.initial_state)
  actions = jnp.ones((2, 4, 1)) * 0.5
  noise = jnp.zeros((2, 4, TOY.stoch_size))
  roll = jax.jit(lambda key: rollout.imagine_sequence(model, params, initial, actions, noise,
                                                      key))
  _, first = roll(jax.random.key(1))
  _, again = roll(jax.random.key(1))
  _, other = roll(jax.random.key(2))
  np.testing.assert_array_equal(first, again)
  # Both batch rows share the weight sample, so equal inputs give equal rewards.
  np.testing.assert_allclose(first[0], first[1], rtol=1e-6)
  differs = float(jnp.max(jnp.abs(first - other)))
  assert differs > 1e-4 if estimator != "deterministic" else differs == 0.0


@pytest.mark.parametrize("change, message", [
    ({"estimator": "bayes"}, "estimator='bayes'"),
    ({"image_size": 24}, "image_size=24"),
    ({"action_repeat": 3}, "action_repeat=3"),
    ({"chunk_length": 100}, "chunk_length=100"),
    ({"cem_top_k": 20}, "cem_top_k=20"),
    ({"open_loop_steps": 20}, "open_loop_steps = 22"),
    ({"learning_rate": 0.0}, "learning_rate=0.0"),
])
def test_config_rejects_bad_values(change, message):
  with pytest.raises(ValueError, match=message):
    dataclasses.replace(TOY, **change)


def test_presets_are_valid_configs():
  assert all(isinstance(c, PlanetConfig) for c in PRESETS.values())
  assert PRESETS["cpu"].decisions >= PRESETS["cpu"].open_loop_context + 50
