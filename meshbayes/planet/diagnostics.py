"""What training did to a world model, measured the same way for every agent of a seed.

``shared_fit`` scores the world model on the probe episodes (random actions that depend on
the seed alone, so PlaNet and Bayesian PlaNet meet the same ones; no agent trains on them):
PlaNet's loss terms at the posterior-mean weights and averaged over weight samples.
``stddev_ratios`` compares the transition posterior's stddevs with its prior's, per layer
(docs/planet.md, "Other measurements").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.planet import rollout
from meshbayes.planet.model import WorldModel
from meshbayes.training.posterior_diagnostics import layer_stddevs

Array = jax.Array
FIT_TERMS = ("image_nll", "reward_nll", "latent_kl")
SHARED_FIT_SAMPLES = 8


def fit_terms(model: WorldModel, params, episodes: dict[str, Array], noise: Array,
              weight_key: Array, deterministic: bool) -> dict[str, Array]:
  """``rollout.sequence_fit`` of whole ``episodes`` as a dict of ``FIT_TERMS``, the latent
  KL averaged over decisions (not clamped: the fit, not the loss). Jit-able."""
  image_nll, reward_nll, latent_kl = rollout.sequence_fit(model, params, episodes, noise,
                                                          weight_key, deterministic)
  return {"image_nll": image_nll, "reward_nll": reward_nll, "latent_kl": jnp.mean(latent_kl)}


def shared_fit(evaluate, bayesian: bool, key: Array, samples: int = SHARED_FIT_SAMPLES
               ) -> dict[str, object]:
  """The fit at the posterior mean and the mean of the fits under ``samples`` weight samples.

  Args:
    evaluate: ``(weight_key, deterministic) -> fit_terms``, its episodes, parameters and
      latent noise bound (the same noise for the mean and every sample).
    bayesian: whether the weights have a posterior; a deterministic model's sampled fit is
      its fit (nothing is drawn).
    key: the weight samples' keys are ``fold_in(key, i)``, the same for every agent.
    samples: weight samples averaged.

  Returns:
    ``{'mean': {term: value}, 'sampled': {term: value}, 'samples': samples}``.
  """
  at_mean = {name: float(value) for name, value in evaluate(key, True).items()}
  if not bayesian:
    return {"mean": at_mean, "sampled": dict(at_mean), "samples": samples}
  draws = [evaluate(jax.random.fold_in(key, index), False) for index in range(samples)]
  sampled = {name: float(np.mean([float(d[name]) for d in draws])) for name in FIT_TERMS}
  return {"mean": at_mean, "sampled": sampled, "samples": samples}


def stddev_ratios(params, fan_in_scaled_prior: bool) -> dict[str, float]:
  """Per Bayesian Dense layer, the median posterior stddev over its prior stddev.

  The prior is N(0, 1) or, ``fan_in_scaled_prior``, N(0, 1 / fan_in) (``PlanetConfig
  .transition_prior``); a kernel's fan-in is its first axis. Empty for a deterministic
  model. Keys are the layers' ``/``-joined paths.
  """
  ratios = {}
  for path, stddev in sorted(layer_stddevs(params).items()):
    prior = 1.0 / math.sqrt(stddev.shape[0]) if fan_in_scaled_prior else 1.0
    ratios[path.rsplit("/", 1)[0]] = float(np.median(np.asarray(stddev))) / prior
  return ratios
