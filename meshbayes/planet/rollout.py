"""The world model run over sequences: filtering on observed images, imagining ahead, and
the fit of observed sequences (PlaNet's loss terms).

Filtering and imagining scan ``WorldModel.apply`` calls over time with one ``'sample'`` key, so a Bayesian
transition uses one weight sample for the whole batch of sequences. The latent noise is
the caller's (zeros: the states' means). Arrays are batch-major ``(batch, time, ...)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from meshbayes.layers import KL_COLLECTION, total_kl
from meshbayes.planet import pendulum
from meshbayes.planet.model import Gaussian, LatentState, WorldModel, gaussian_kl

Array = jax.Array


def observe_sequence(model: WorldModel, params, images: Array, prev_actions: Array,
                     noise: Array, weight_key: Array, deterministic: bool = False,
                     initial: LatentState | None = None
                     ) -> tuple[LatentState, Gaussian, Gaussian]:
  """Posterior states of ``images`` ``(B, T, S, S, 1)`` given the actions that led to them.

  Args:
    model, params: the world model and its parameters.
    images: the observations; ``prev_actions`` ``(B, T, A)``: the action before each.
    noise: ``(B, T, stoch_size)`` standard-normal noise of the posterior samples.
    weight_key: the ``'sample'`` key of the transition's weights.
    deterministic: posterior-mean transition weights.
    initial: the state before the first image (default: zeros).

  Returns:
    The posterior states, priors and posteriors, each ``(B, T, ...)``.
  """
  variables = {"params": params}
  embeds = model.apply(variables, images, method=WorldModel.encode)
  if initial is None:
    initial = model.apply(variables, images.shape[:1], method=WorldModel.initial_state)

  def step(state, inputs):
    action, embed, eps = inputs
    state, prior, posterior = model.apply(variables, state, action, embed, eps, deterministic,
                                          rngs={"sample": weight_key},
                                          method=WorldModel.observe_step)
    return state, (state, prior, posterior)

  time_major = lambda x: jnp.swapaxes(x, 0, 1)
  _, outputs = jax.lax.scan(step, initial, (time_major(prev_actions), time_major(embeds),
                                            time_major(noise)))
  return jax.tree.map(time_major, outputs)


def imagine_sequence(model: WorldModel, params, initial: LatentState, actions: Array,
                     noise: Array, weight_key: Array, deterministic: bool = False
                     ) -> tuple[LatentState, Array]:
  """Prior states from ``initial`` ``(B, ...)`` under ``actions`` ``(B, H, A)`` with latent
  ``noise`` ``(B, H, stoch_size)``: the states ``(B, H, ...)`` and predicted rewards ``(B, H)``."""
  variables = {"params": params}

  def step(state, inputs):
    action, eps = inputs
    state, _ = model.apply(variables, state, action, eps, deterministic,
                           rngs={"sample": weight_key}, method=WorldModel.imagine_step)
    return state, (state, model.apply(variables, state, method=WorldModel.reward))

  time_major = lambda x: jnp.swapaxes(x, 0, 1)
  _, (states, rewards) = jax.lax.scan(step, initial, (time_major(actions), time_major(noise)))
  return jax.tree.map(time_major, states), time_major(rewards)


def weight_kl(model: WorldModel, params) -> Array:
  """The KL of the transition's weight posterior from its prior (0 for a deterministic one).

  A layer records its KL once per ``apply`` whatever its input, so one imagine step on a
  batch of zeros gives it.
  """
  variables = {"params": params}
  state = model.apply(variables, (1,), method=WorldModel.initial_state)
  action = jnp.zeros((1, model.action_dim))
  _, collections = model.apply(variables, state, action, state.stoch, True,
                               method=WorldModel.imagine_step, mutable=[KL_COLLECTION])
  return total_kl(collections)


def sequence_fit(model: WorldModel, params, batch: dict[str, Array], noise: Array,
                 weight_key: Array, deterministic: bool = False
                 ) -> tuple[Array, Array, Array]:
  """How well the model explains observed sequences: PlaNet's loss terms per decision.

  Args:
    model, params: the world model and its parameters.
    batch: ``images`` ``(B, T, S, S, 1)``, ``prev_actions`` ``(B, T, A)`` and ``rewards``
      ``(B, T)`` (the environment's, summed over a decision's steps).
    noise, weight_key, deterministic: as ``observe_sequence``'s.

  Returns:
    The image's Gaussian NLL (unit variance, summed over pixels, constant dropped) and the
    reward's (in units of ``pendulum.REWARD_UNIT``), each a mean over the decisions, and
    the latent KL(posterior || prior) of each decision ``(B, T)``.
  """
  images = batch["images"]
  states, priors, posteriors = observe_sequence(model, params, images, batch["prev_actions"],
                                                noise, weight_key, deterministic)
  variables = {"params": params}
  predicted = model.apply(variables, states, method=WorldModel.decode)
  image_nll = 0.5 * jnp.mean(jnp.sum(jnp.square(images - predicted), axis=(-3, -2, -1)))
  rewards = model.apply(variables, states, method=WorldModel.reward)
  targets = batch["rewards"] / pendulum.REWARD_UNIT
  reward_nll = 0.5 * jnp.mean(jnp.square(targets - rewards))
  return image_nll, reward_nll, gaussian_kl(posteriors, priors)
