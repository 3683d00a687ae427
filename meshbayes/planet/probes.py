"""What a trained world model knows: open-loop prediction error and a linear velocity probe.

Both run on the states' means (no latent noise) with a Bayesian transition's posterior-mean
weights, and are pure functions of arrays, to be jitted by the caller (docs/planet.md,
"Other measurements": the protocol).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.planet import rollout
from meshbayes.planet.model import LatentState, WorldModel, features

Array = jax.Array


def _posterior_means(model: WorldModel, params, images: Array, prev_actions: Array):
  noise = jnp.zeros(images.shape[:2] + (model.stoch_size,))
  return rollout.observe_sequence(model, params, images, prev_actions, noise,
                                  jax.random.key(0), deterministic=True)


def posterior_features(model: WorldModel, params, images: Array, prev_actions: Array) -> Array:
  """Features ``(B, T, deter + stoch)`` of the posterior means along episodes ``(B, T, ...)``."""
  states, _, posteriors = _posterior_means(model, params, images, prev_actions)
  return features(LatentState(states.deter, posteriors.mean))


def open_loop_error(model: WorldModel, params, images: Array, prev_actions: Array,
                    context: int, steps: int) -> Array:
  """Per-step mean squared pixel error ``(steps,)`` of the open-loop prediction, averaged
  over the episodes ``(B, T, ...)`` (``T >= context + steps``)."""
  states, _, _ = _posterior_means(model, params, images[:, :context], prev_actions[:, :context])
  last = jax.tree.map(lambda x: x[:, -1], states)
  actions = prev_actions[:, context:context + steps]
  noise = jnp.zeros(actions.shape[:2] + (model.stoch_size,))
  imagined, _ = rollout.imagine_sequence(model, params, last, actions, noise,
                                         jax.random.key(0), deterministic=True)
  predicted = model.apply({"params": params}, imagined, method=WorldModel.decode)
  truth = images[:, context:context + steps]
  return jnp.mean(jnp.square(predicted - truth), axis=(0, 2, 3, 4))


def linear_probe_r2(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                    test_y: np.ndarray, ridge: float = 1e-3) -> float:
  """R^2 on ``test`` of the ridge read-out ``y ~ x`` fitted on ``train`` (features
  standardized with the training statistics).

  >>> x = np.arange(10.0)[:, None]
  >>> round(linear_probe_r2(x, 3 * x[:, 0] + 1, x + 0.5, 3 * x[:, 0] + 2.5), 4)
  1.0
  """
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  design = lambda x: np.concatenate([(x - mean) / std, np.ones((len(x), 1))], axis=1)
  a = design(train_x)
  weights = np.linalg.solve(a.T @ a + ridge * len(a) * np.eye(a.shape[1]), a.T @ train_y)
  residual = test_y - design(test_x) @ weights
  return float(1.0 - np.sum(residual ** 2) / np.sum((test_y - test_y.mean()) ** 2))
