"""The classic-control pendulum (gym's Pendulum-v1) in JAX: state, reset and one step.

gym's equations, limits and reward (docs/planet.md states them); ``theta = 0`` is upright.
Everything is a pure function of arrays, so an episode jits and vmaps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array

MAX_SPEED = 8.0
MAX_TORQUE = 2.0
DT = 0.05
GRAVITY = 10.0
MASS = 1.0
LENGTH = 1.0
# The largest magnitude of one step's reward (upside down at full speed and torque): the
# reward model's unit, so its loss weight reads as for rewards of at most 1 per step.
REWARD_UNIT = 3.141592653589793 ** 2 + 0.1 * MAX_SPEED ** 2 + 0.001 * MAX_TORQUE ** 2


class PendulumState(NamedTuple):
  """The pendulum's angle (radians, 0 upright) and angular velocity (radians per second)."""
  theta: Array
  theta_dot: Array


def angle_normalize(theta: Array) -> Array:
  """``theta`` wrapped into ``[-pi, pi)``.

  >>> round(float(angle_normalize(jnp.asarray(3 * jnp.pi / 2))), 4)
  -1.5708
  """
  return ((theta + jnp.pi) % (2 * jnp.pi)) - jnp.pi


def reset(key: Array) -> PendulumState:
  """A start state as gym draws it: angle on ``[-pi, pi]``, velocity on ``[-1, 1]``."""
  key_theta, key_dot = jax.random.split(key)
  return PendulumState(jax.random.uniform(key_theta, (), minval=-jnp.pi, maxval=jnp.pi),
                       jax.random.uniform(key_dot, (), minval=-1.0, maxval=1.0))


def step(state: PendulumState, torque: Array) -> tuple[PendulumState, Array]:
  """One step of ``DT`` seconds under ``torque`` (clipped to ``[-2, 2]``): the next state
  and the step's reward (at most 0)."""
  u = jnp.clip(torque, -MAX_TORQUE, MAX_TORQUE)
  theta, theta_dot = state
  reward = -(jnp.square(angle_normalize(theta)) + 0.1 * jnp.square(theta_dot)
             + 0.001 * jnp.square(u))
  theta_dot = theta_dot + (3 * GRAVITY / (2 * LENGTH) * jnp.sin(theta)
                           + 3.0 / (MASS * LENGTH ** 2) * u) * DT
  theta_dot = jnp.clip(theta_dot, -MAX_SPEED, MAX_SPEED)
  return PendulumState(theta + theta_dot * DT, theta_dot), reward


def repeated_step(state: PendulumState, action: Array, repeat: int
                  ) -> tuple[PendulumState, Array]:
  """``repeat`` steps under one action in ``[-1, 1]`` (scaled to the torque range): the
  final state and the rewards' sum."""
  def body(state, _):
    return step(state, action * MAX_TORQUE)
  state, rewards = jax.lax.scan(body, state, None, length=repeat)
  return state, jnp.sum(rewards)
