"""Decision rules of a Bayesian agent and PlaNet's loss: per-element free nats, the summed
reward with its scale."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from meshbayes.layers.posteriors import sample_weights
from meshbayes.planet import pendulum, rollout
from meshbayes.planet.agent import Agent, ReplayBuffer
from meshbayes.planet.config import DECISION_RULES, PRESETS
from meshbayes.planet.model import gaussian_kl

TOY = PRESETS["toy"]
BAYESIAN = dataclasses.replace(TOY, estimator="reparameterization",
                               transition_stddev_ratio=1.0)  # samples far from the mean


@pytest.fixture(scope="module")
def agents():
  return Agent(TOY), Agent(BAYESIAN)


@pytest.fixture(scope="module")
def bayesian_params(agents):
  params, _ = agents[1].init(jax.random.key(3))
  return params


def _at_posterior_mean(bayesian):
  """PlaNet's parameters with every transition kernel at the Bayesian posterior's mean."""
  flat = {}
  for path, value in traverse_util.flatten_dict(bayesian).items():
    if path[-1] == "kernel_scale":
      continue
    flat[path[:-1] + ("kernel",) if path[-1] == "kernel_loc" else path] = value
  return traverse_util.unflatten_dict(flat)


def test_the_mean_rule_acts_as_planet_at_the_posterior_mean(agents, bayesian_params):
  deterministic, bayesian = agents
  key = jax.random.key(5)
  got = bayesian.policy_episode(bayesian_params, key, 0.0, "mean")
  want = deterministic.policy_episode(_at_posterior_mean(bayesian_params), key, 0.0)
  np.testing.assert_allclose(got.prev_actions, want.prev_actions, atol=1e-5)
  np.testing.assert_allclose(got.rewards, want.rewards, atol=1e-4)


def test_thompson_acts_on_one_weight_sample_for_the_whole_episode(agents, bayesian_params):
  _, bayesian = agents
  key = jax.random.key(6)
  sample = sample_weights(bayesian_params, jax.random.split(key, 3)[2])  # the episode's key
  got = bayesian.policy_episode(bayesian_params, key, 0.0, "thompson")
  want = bayesian.policy_episode(sample, key, 0.0, "mean")
  np.testing.assert_allclose(got.prev_actions, want.prev_actions, atol=1e-5)
  # Another episode key draws another sample: other actions from the same start.
  other = bayesian.policy_episode(
      sample_weights(bayesian_params, jax.random.key(99)), key, 0.0, "mean")
  assert float(jnp.max(jnp.abs(other.prev_actions - got.prev_actions))) > 1e-3


def test_every_rule_starts_where_the_others_do_and_acts_differently(agents, bayesian_params):
  _, bayesian = agents
  key = jax.random.key(7)
  episodes = {rule: bayesian.policy_episode(bayesian_params, key, 0.0, rule)
              for rule in DECISION_RULES}
  first = {rule: np.asarray(e.images[0]) for rule, e in episodes.items()}
  for rule in DECISION_RULES:
    np.testing.assert_array_equal(first[rule], first["mean"])
  actions = [np.asarray(e.prev_actions) for e in episodes.values()]
  for i in range(len(actions)):
    for j in range(i + 1, len(actions)):
      assert np.max(np.abs(actions[i] - actions[j])) > 1e-3


def test_the_average_rule_scores_the_mean_of_the_samples_returns(agents, bayesian_params):
  _, bayesian = agents
  state = bayesian.model.initial_state((1,))
  actions = jax.random.uniform(jax.random.key(1), (5, TOY.horizon, 1), minval=-1, maxval=1)
  key = jax.random.key(2)
  samples = [sample_weights(bayesian_params, k) for k in jax.random.split(key, 3)]
  objective = jax.jit(bayesian.plan_objective)
  each = [objective([w], state, actions, key) for w in samples]
  np.testing.assert_allclose(objective(samples, state, actions, key), np.mean(each, axis=0),
                             rtol=1e-5, atol=1e-5)
  assert float(jnp.max(jnp.abs(each[0] - each[1]))) > 1e-4
  # The rule's weights: the mean to filter, plan_samples samples to plan.
  filtering, planning = bayesian.rule_weights(bayesian_params, "average", key, key)
  assert filtering is bayesian_params and len(planning) == BAYESIAN.plan_samples


def test_a_deterministic_agent_has_one_rule(agents):
  deterministic, _ = agents
  params, _ = deterministic.init(jax.random.key(0))
  with pytest.raises(ValueError, match="rule='thompson' is not one of mean for this agent"):
    deterministic.policy_episode(params, jax.random.key(0), 0.0, "thompson")


def _batch(agent, episodes=2):
  buffer = ReplayBuffer(agent.config, episodes)
  for index in range(episodes):
    buffer.add(agent.random_episode(jax.random.key(index)))
  return {k: jnp.asarray(v) for k, v in buffer.sample(np.random.default_rng(0)).items()}


def test_free_nats_clamp_each_element_so_the_prior_learns(agents):
  deterministic, _ = agents
  params, _ = deterministic.init(jax.random.key(0))
  batch = _batch(deterministic)
  key = jax.random.key(4)
  noise = jax.random.normal(jax.random.split(key)[0], batch["images"].shape[:2]
                            + (TOY.stoch_size,))
  _, priors, posteriors = rollout.observe_sequence(
      deterministic.model, params, batch["images"], batch["prev_actions"], noise,
      jax.random.split(key)[1])
  kl = np.asarray(gaussian_kl(posteriors, priors))
  # Free nats between the batch mean and the largest element: the old batch-level clamp
  # gave the prior's layers no gradient at all.
  free_nats = float(kl.mean() + kl.max()) / 2
  agent = Agent(dataclasses.replace(TOY, free_nats=free_nats))
  loss = lambda p: agent.loss(p, batch, key, 0.0)
  _, metrics = loss(params)
  assert float(metrics["latent_term"]) == pytest.approx(np.mean(np.maximum(free_nats, kl)),
                                                        rel=1e-5)
  assert float(metrics["latent_kl"]) == pytest.approx(kl.mean(), rel=1e-5)
  grads = jax.grad(lambda p: loss(p)[0])(params)
  stats_gradient = float(jnp.sum(jnp.abs(grads["rssm"]["transition_stats"]["kernel"])))
  assert stats_gradient > 1e-6


def test_the_reward_loss_is_the_decisions_summed_reward_times_its_scale(agents):
  assert pendulum.REWARD_UNIT == pytest.approx(np.pi ** 2 + 6.4 + 0.004)
  deterministic, _ = agents
  params, _ = deterministic.init(jax.random.key(0))
  batch = _batch(deterministic)
  key = jax.random.key(4)
  losses = {}
  for scale in (0.0, 10.0):
    agent = Agent(dataclasses.replace(TOY, reward_scale=scale))
    losses[scale] = agent.loss(params, batch, key, 0.0)
  noise = jax.random.normal(jax.random.split(key)[0], batch["images"].shape[:2]
                            + (TOY.stoch_size,))
  states, _, _ = rollout.observe_sequence(deterministic.model, params, batch["images"],
                                          batch["prev_actions"], noise,
                                          jax.random.split(key)[1])
  predicted = deterministic.model.apply({"params": params}, states,
                                        method=deterministic.model.reward)
  # The target is the reward the decision earned over its action_repeat steps, in units of
  # the largest step reward's magnitude: pi^2 + 0.1 * 8^2 + 0.001 * 2^2.
  targets = np.asarray(batch["rewards"]) / 16.2736044
  want = 0.5 * np.mean(np.square(targets - np.asarray(predicted)))
  assert float(losses[10.0][1]["reward_nll"]) == pytest.approx(want, rel=1e-5)
  assert float(losses[10.0][0] - losses[0.0][0]) == pytest.approx(10.0 * want, rel=1e-4)
