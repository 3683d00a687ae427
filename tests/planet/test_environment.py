"""The pendulum against gym's equations in numpy, and its rendered images."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from meshbayes.planet import pendulum
from meshbayes.planet.render import render


def gym_step(theta, theta_dot, u):
  """gym's Pendulum-v1 step, transcribed in numpy (g=10, m=l=1, dt=0.05)."""
  u = np.clip(u, -2.0, 2.0)
  normalized = ((theta + np.pi) % (2 * np.pi)) - np.pi
  cost = normalized ** 2 + 0.1 * theta_dot ** 2 + 0.001 * u ** 2
  new_dot = theta_dot + (3 * 10.0 / 2 * np.sin(theta) + 3.0 * u) * 0.05
  new_dot = np.clip(new_dot, -8.0, 8.0)
  return theta + new_dot * 0.05, new_dot, -cost


def test_step_matches_gym_equations():
  rng = np.random.default_rng(0)
  theta = rng.uniform(-7, 7, 200).astype(np.float32)
  theta_dot = rng.uniform(-8, 8, 200).astype(np.float32)
  torque = rng.uniform(-4, 4, 200).astype(np.float32)  # half of them beyond the clip
  state, reward = jax.vmap(pendulum.step)(pendulum.PendulumState(theta, theta_dot), torque)
  want_theta, want_dot, want_reward = gym_step(theta.astype(np.float64),
                                               theta_dot.astype(np.float64), torque)
  np.testing.assert_allclose(state.theta, want_theta, atol=2e-5)
  np.testing.assert_allclose(state.theta_dot, want_dot, atol=2e-5)
  np.testing.assert_allclose(reward, want_reward, rtol=1e-5, atol=1e-4)
  assert float(jnp.max(jnp.abs(state.theta_dot))) <= 8.0


def test_repeated_step_sums_rewards_of_single_steps():
  state = pendulum.PendulumState(jnp.float32(2.0), jnp.float32(-1.0))
  single, total = state, 0.0
  for _ in range(3):
    single, reward = pendulum.step(single, jnp.float32(0.5 * 2.0))
    total += float(reward)
  repeated, summed = pendulum.repeated_step(state, jnp.float32(0.5), 3)
  assert float(repeated.theta) == pytest.approx(float(single.theta), abs=1e-6)
  assert float(summed) == pytest.approx(total, rel=1e-6)


def test_reset_ranges():
  states = jax.vmap(pendulum.reset)(jax.random.split(jax.random.key(0), 500))
  assert float(jnp.min(states.theta)) >= -np.pi and float(jnp.max(states.theta)) <= np.pi
  assert float(jnp.max(jnp.abs(states.theta_dot))) <= 1.0
  assert float(jnp.std(states.theta)) > 1.5  # spread over the circle


@pytest.mark.parametrize("theta", [0.0, 0.7, np.pi / 2, 2.5, -2.0, -np.pi / 2])
def test_render_draws_the_rod_at_its_angle(theta):
  image = np.asarray(render(jnp.float32(theta), 32))[:, :, 0]
  assert image.shape == (32, 32) and image.min() == 0.0 and image.max() == 1.0
  coords = (np.arange(32) + 0.5) / 32 * 2 - 1
  x, y = np.meshgrid(coords, -coords)  # y up, as the pendulum's
  mass = image.sum()
  angle = np.arctan2((image * x).sum() / mass, (image * y).sum() / mass)  # 0 up, clockwise
  assert abs(np.angle(np.exp(1j * (angle - theta)))) < 0.05
  # The rod's brightness is the same at every angle (antialiased, not aliased away).
  upright = float(render(jnp.float32(0.0), 32).sum())
  assert mass == pytest.approx(upright, rel=0.1)


def test_render_rejects_tiny_images():
  with pytest.raises(ValueError, match="size=2"):
    render(jnp.float32(0.0), 2)
