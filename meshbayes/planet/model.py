"""PlaNet's world model: a recurrent state-space model (RSSM) of images and rewards.

The state is a GRU's ``deter`` and a Gaussian ``stoch``; a convolutional encoder embeds
images, a decoder and a reward model read ``concat(deter, stoch)``. Bayesian PlaNet differs
only in the transition's three Dense layers (``dense_class(estimator)``), whose weights come
from the ``'sample'`` rng: one ``apply`` with one key uses one weight sample in all its
calls. The latent noise is an argument, so every call is reproducible.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from meshbayes.layers import NormalPrior, dense_class, fan_in_stddev

Array = jax.Array


class LatentState(NamedTuple):
  """The RSSM's state: ``deter`` ``(..., deter_size)``, ``stoch`` ``(..., stoch_size)``."""
  deter: Array
  stoch: Array


class Gaussian(NamedTuple):
  """A diagonal Gaussian over the stochastic state."""
  mean: Array
  stddev: Array


def features(state: LatentState) -> Array:
  """What the decoder and reward model read: ``concat(deter, stoch)``."""
  return jnp.concatenate([state.deter, state.stoch], axis=-1)


def gaussian_kl(p: Gaussian, q: Gaussian) -> Array:
  """``KL(p || q)`` of diagonal Gaussians, summed over the last axis.

  >>> g = Gaussian(jnp.zeros(2), jnp.ones(2))
  >>> float(gaussian_kl(g, g)), float(gaussian_kl(Gaussian(jnp.ones(2), jnp.ones(2)), g))
  (0.0, 1.0)
  """
  ratio = jnp.square(p.stddev / q.stddev)
  return 0.5 * jnp.sum(ratio + jnp.square((p.mean - q.mean) / q.stddev) - 1.0 - jnp.log(ratio),
                       axis=-1)


class Encoder(nn.Module):
  """Image ``(..., S, S, 1)`` to a flat embedding: stride-2 convolutions down to 4x4."""
  depth: int

  @nn.compact
  def __call__(self, images: Array) -> Array:
    batch = images.shape[:-3]
    x = images.reshape((-1,) + images.shape[-3:])
    channels = self.depth
    while x.shape[1] > 4:
      x = nn.relu(nn.Conv(channels, (4, 4), strides=(2, 2), padding="SAME")(x))
      channels *= 2
    return x.reshape(batch + (-1,))


class Decoder(nn.Module):
  """State features to the image's mean ``(..., S, S, 1)``: transposed convolutions up from 4x4."""
  depth: int
  image_size: int

  @nn.compact
  def __call__(self, feats: Array) -> Array:
    batch = feats.shape[:-1]
    layers = (self.image_size // 4).bit_length() - 1  # doublings from 4 to image_size
    channels = self.depth * 2 ** (layers - 1)
    x = nn.Dense(4 * 4 * channels)(feats.reshape((-1, feats.shape[-1])))
    x = x.reshape((-1, 4, 4, channels))
    for layer in range(layers):
      last = layer == layers - 1
      x = nn.ConvTranspose(1 if last else channels // 2, (4, 4), strides=(2, 2),
                           padding="SAME")(nn.relu(x))
      channels //= 2
    return x.reshape(batch + (self.image_size, self.image_size, 1))


class RSSM(nn.Module):
  """The transition (prior: ``Dense -> GRU -> Dense -> Dense`` to the stochastic state's
  mean and stddev) and the posterior (the image's embedding added to the GRU's new state).

  ``transition_prior`` and ``transition_stddev_ratio`` are ``PlanetConfig``'s (a
  deterministic transition ignores them)."""
  deter_size: int
  stoch_size: int
  hidden_size: int
  min_std: float
  estimator: str
  transition_prior: str = "standard_normal"
  transition_stddev_ratio: float = 0.1

  def setup(self):
    transition_dense = functools.partial(
        dense_class(self.estimator),
        prior=NormalPrior(fan_in_scaled=self.transition_prior == "fan_in_scaled"),
        kernel_stddev_init=fan_in_stddev(self.transition_stddev_ratio))
    self.transition_input = transition_dense(self.hidden_size)
    self.cell = nn.GRUCell(self.deter_size)
    self.transition_hidden = transition_dense(self.hidden_size)
    self.transition_stats = transition_dense(2 * self.stoch_size)
    self.posterior_hidden = nn.Dense(self.hidden_size)
    self.posterior_stats = nn.Dense(2 * self.stoch_size)

  def _gaussian(self, stats: Array) -> Gaussian:
    mean, raw = jnp.split(stats, 2, axis=-1)
    return Gaussian(mean, nn.softplus(raw) + self.min_std)

  def imagine_step(self, state: LatentState, action: Array, noise: Array,
                   deterministic: bool = False) -> tuple[LatentState, Gaussian]:
    """The prior: next state (its stoch ``mean + stddev * noise``) and its Gaussian.

    ``deterministic`` runs a Bayesian transition at its posterior-mean weights.
    """
    x = jnp.concatenate([state.stoch, action], axis=-1)
    x = nn.relu(self.transition_input(x, deterministic=deterministic))
    deter, _ = self.cell(state.deter, x)
    x = nn.relu(self.transition_hidden(deter, deterministic=deterministic))
    prior = self._gaussian(self.transition_stats(x, deterministic=deterministic))
    return LatentState(deter, prior.mean + prior.stddev * noise), prior

  def observe_step(self, state: LatentState, action: Array, embed: Array, noise: Array,
                   deterministic: bool = False) -> tuple[LatentState, Gaussian, Gaussian]:
    """The posterior given the new image's ``embed``: its state, the prior and the posterior."""
    prior_state, prior = self.imagine_step(state, action, noise, deterministic)
    x = nn.relu(self.posterior_hidden(jnp.concatenate([prior_state.deter, embed], axis=-1)))
    posterior = self._gaussian(self.posterior_stats(x))
    return (LatentState(prior_state.deter, posterior.mean + posterior.stddev * noise),
            prior, posterior)


class WorldModel(nn.Module):
  """Encoder, RSSM, decoder and reward model of one agent (sizes from ``PlanetConfig``)."""
  image_size: int
  deter_size: int
  stoch_size: int
  hidden_size: int
  conv_depth: int
  min_std: float
  estimator: str
  transition_prior: str = "standard_normal"
  transition_stddev_ratio: float = 0.1
  action_dim: int = 1

  def setup(self):
    self.encoder = Encoder(self.conv_depth)
    self.decoder = Decoder(self.conv_depth, self.image_size)
    self.rssm = RSSM(self.deter_size, self.stoch_size, self.hidden_size, self.min_std,
                     self.estimator, self.transition_prior, self.transition_stddev_ratio)
    self.reward_hidden = [nn.Dense(self.hidden_size), nn.Dense(self.hidden_size)]
    self.reward_out = nn.Dense(1)

  def initial_state(self, batch: tuple[int, ...]) -> LatentState:
    """The all-zero state every sequence starts from."""
    return LatentState(jnp.zeros(batch + (self.deter_size,)),
                       jnp.zeros(batch + (self.stoch_size,)))

  def encode(self, images: Array) -> Array:
    return self.encoder(images)

  def decode(self, state: LatentState) -> Array:
    return self.decoder(features(state))

  def reward(self, state: LatentState) -> Array:
    """The predicted reward of arriving at ``state``: the decision's, summed over its
    ``action_repeat`` environment steps, in units of ``pendulum.REWARD_UNIT``."""
    x = features(state)
    for layer in self.reward_hidden:
      x = nn.relu(layer(x))
    return self.reward_out(x)[..., 0]

  def imagine_step(self, state, action, noise, deterministic=False):
    return self.rssm.imagine_step(state, action, noise, deterministic)

  def observe_step(self, state, action, embed, noise, deterministic=False):
    return self.rssm.observe_step(state, action, embed, noise, deterministic)

  def __call__(self, images: Array, actions: Array) -> tuple[Array, Array]:
    """One observe step from the initial state, decoded (initializes every parameter)."""
    batch = images.shape[:-3]
    state, _, _ = self.observe_step(self.initial_state(batch), actions, self.encode(images),
                                    jnp.zeros(batch + (self.stoch_size,)))
    return self.decode(state), self.reward(state)


def world_model(config) -> WorldModel:
  """The world model a ``PlanetConfig`` describes."""
  return WorldModel(config.image_size, config.deter_size, config.stoch_size, config.hidden_size,
                    config.conv_depth, config.min_std, config.estimator,
                    config.transition_prior, config.transition_stddev_ratio)
