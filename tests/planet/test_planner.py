"""CEM finds the optimum of a known objective."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.planet.planner import cem


def test_cem_finds_the_maximum_of_a_quadratic():
  target = jnp.array([[0.5], [-0.3], [0.9], [-0.8], [0.0]])

  def objective(actions, key):
    return -jnp.sum(jnp.square(actions - target), axis=(1, 2))

  plan = jax.jit(lambda key: cem(objective, key, horizon=5, action_dim=1, iterations=10,
                                 candidates=300, top_k=30))(jax.random.key(0))
  np.testing.assert_allclose(plan, target, atol=0.05)


def test_cem_stays_in_the_action_bounds():
  # The optimum lies outside [-1, 1]: the plan goes to the bound, not past it.
  plan = cem(lambda a, key: jnp.sum(a, axis=(1, 2)), jax.random.key(1), horizon=3,
             action_dim=2, iterations=6, candidates=100, top_k=10)
  assert float(jnp.min(plan)) > 0.9 and float(jnp.max(plan)) <= 1.0


def test_cem_rejects_an_elite_larger_than_the_candidates():
  with pytest.raises(ValueError, match="top_k=20"):
    cem(lambda a, key: a.sum((1, 2)), jax.random.key(0), horizon=2, action_dim=1,
        iterations=1, candidates=10, top_k=20)
