"""The PlaNet agent: collecting episodes, the replay buffer, and the training step.

An episode is one jitted scan (render, filter, plan with CEM, act) under a decision rule
(``config.DECISION_RULES``), each rule running the transition at fixed weights
(``deterministic=True``). The loss is PlaNet's per decision plus a Bayesian agent's
weight KL over the ``D`` decisions in the buffer (docs/planet.md, "The loss").
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from meshbayes.layers.posteriors import sample_weights
from meshbayes.planet import pendulum, rollout
from meshbayes.planet.config import PlanetConfig
from meshbayes.planet.model import LatentState, WorldModel, world_model
from meshbayes.planet.planner import cem
from meshbayes.planet.render import render

Array = jax.Array
ACTION_DIM = 1


class Episode(NamedTuple):
  """One episode, ``decisions + 1`` entries: entry ``t`` is the image seen at decision
  ``t``, the action before it (0 at the start), the rewards that action earned over its
  ``action_repeat`` environment steps (0 at the start) and the true angular velocity at
  the image. Arrays, batch-free."""
  images: Array
  prev_actions: Array
  rewards: Array
  velocities: Array

  @property
  def total_return(self) -> float:
    """The episode's return: the environment's rewards summed over its steps."""
    return float(np.sum(self.rewards))


class ReplayBuffer:
  """Every collected episode, on the host; samples chunks of consecutive decisions."""

  def __init__(self, config: PlanetConfig, capacity: int):
    n, s = config.decisions + 1, config.image_size
    self.config = config
    self.images = np.zeros((capacity, n, s, s, 1), np.float32)
    self.prev_actions = np.zeros((capacity, n, ACTION_DIM), np.float32)
    self.rewards = np.zeros((capacity, n), np.float32)
    self.velocities = np.zeros((capacity, n), np.float32)
    self.episodes = 0

  def add(self, episode: Episode) -> None:
    """Stores ``episode``; a full buffer refuses it."""
    if self.episodes == len(self.images):
      raise ValueError(f"ReplayBuffer: full at {self.episodes} episodes")
    for name in Episode._fields:
      getattr(self, name)[self.episodes] = np.asarray(getattr(episode, name))
    self.episodes += 1

  @property
  def decisions(self) -> int:
    """Decisions (transitions with a reward) stored: the data size ``D`` of the ELBO."""
    return self.episodes * self.config.decisions

  def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``batch_size`` chunks of ``chunk_length`` entries, each after an episode's start."""
    c = self.config
    episode = rng.integers(0, self.episodes, c.batch_size)
    start = rng.integers(1, c.decisions + 2 - c.chunk_length, c.batch_size)
    index = start[:, None] + np.arange(c.chunk_length)
    return {"images": self.images[episode[:, None], index],
            "prev_actions": self.prev_actions[episode[:, None], index],
            "rewards": self.rewards[episode[:, None], index]}


class Agent:
  """One agent's jitted functions (built once, shared by every seed of a config).

  ``config.seed`` is not used here: ``init`` and the collection take keys.
  """

  def __init__(self, config: PlanetConfig):
    self.config = config
    self.model: WorldModel = world_model(config)
    self.optimizer = optax.chain(optax.clip_by_global_norm(config.grad_clip),
                                 optax.adam(config.learning_rate, eps=1e-4))
    self._compiled = {}  # by name: each program compiled ahead of time at its first call
    self.compile_seconds = 0.0
    self.memory = None  # XLA's memory analysis of the train step

  def init(self, key: Array):
    """Parameters and optimizer state."""
    s = self.config.image_size
    params = self.call_compiled("init", self.model.init, key, jnp.zeros((1, s, s, 1)),
                                jnp.zeros((1, ACTION_DIM)))["params"]
    return params, self.optimizer.init(params)

  # Training.

  def loss(self, params, batch: dict[str, Array], key: Array, inverse_decisions: Array):
    """The per-decision negative ELBO of a batch and its terms.

    ``inverse_decisions`` is ``1 / D`` (times the KL weight's warm-up factor), traced, so the
    step compiles once as the buffer grows.
    """
    c = self.config
    key_noise, key_weights = jax.random.split(key)
    noise = jax.random.normal(key_noise, batch["images"].shape[:2] + (c.stoch_size,))
    image_nll, reward_nll, latent_kl = rollout.sequence_fit(self.model, params, batch, noise,
                                                            key_weights)
    # Clamped per element, as PlaNet: a batch mean under free_nats would cut the prior's
    # gradient everywhere, also where one element's KL is large.
    latent_term = jnp.mean(jnp.maximum(c.free_nats, latent_kl))
    weight_kl = rollout.weight_kl(self.model, params)
    # kl_penalty's per-unit scaling, kl_weight * KL / D, with 1 / D traced.
    loss = (image_nll + c.reward_scale * reward_nll + latent_term
            + c.weight_kl_weight * weight_kl * inverse_decisions)
    return loss, {"loss": loss, "image_nll": image_nll, "reward_nll": reward_nll,
                  "latent_kl": jnp.mean(latent_kl), "latent_term": latent_term,
                  "weight_kl": weight_kl}

  def _step(self, params, opt_state, batch, key, inverse_decisions):
    grads, metrics = jax.grad(self.loss, has_aux=True)(params, batch, key, inverse_decisions)
    updates, opt_state = self.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics

  def call_compiled(self, name: str, function, *args):
    """``function(*args)`` jitted, compiled ahead of time at the first call (its time added
    to ``compile_seconds``), so timed calls never include a compile."""
    if name not in self._compiled:
      start = time.perf_counter()
      self._compiled[name] = jax.jit(function).lower(*args).compile()
      self.compile_seconds += time.perf_counter() - start
    return self._compiled[name](*args)

  def train_step(self, params, opt_state, batch, key, inverse_decisions):
    """One Adam step: the new parameters, optimizer state and the loss's terms. The first
    call compiles and keeps the XLA memory analysis in ``memory``."""
    outputs = self.call_compiled("train_step", self._step, params, opt_state, batch, key,
                                 jnp.asarray(inverse_decisions, jnp.float32))
    if self.memory is None:
      self.memory = memory_of(self._compiled["train_step"])
    return outputs

  def weight_kl(self, params) -> Array:
    """The transition weights' KL from their prior (0 for the deterministic agent)."""
    return self.call_compiled("weight_kl", functools.partial(rollout.weight_kl, self.model),
                              params)

  def random_episode(self, key: Array) -> "Episode":
    """An episode of uniformly random actions."""
    return self.call_compiled("random_episode", self._random_episode, key)

  def policy_episode(self, params, key: Array, noise_stddev: float,
                     rule: str | None = None) -> "Episode":
    """An episode of the planner's actions plus Gaussian noise of ``noise_stddev``, acting by
    decision ``rule`` (default ``config.collect_rule``; ``mean`` for a deterministic agent)."""
    rule = rule or (self.config.collect_rule if self.config.bayesian else "mean")
    if rule not in self.config.decision_rules:
      raise ValueError(f"Agent.policy_episode: rule={rule!r} is not one of "
                       f"{', '.join(self.config.decision_rules)} for this agent")
    return self.call_compiled(f"policy_episode_{rule}",
                              functools.partial(self._policy_episode, rule=rule), params, key,
                              jnp.asarray(noise_stddev, jnp.float32))

  # Acting.

  def plan_objective(self, weights: list, state: LatentState, actions: Array,
                     key_noise: Array) -> Array:
    """CEM's score of ``actions`` ``(N, horizon, A)`` from ``state`` (batch 1): the predicted
    return, averaged over the transition ``weights`` (parameter sets run at
    ``deterministic=True``), each under the same latent noise."""
    initial = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(actions),) + x.shape[1:]), state)
    noise = jax.random.normal(key_noise, actions.shape[:2] + (self.config.stoch_size,))
    returns = [jnp.sum(rollout.imagine_sequence(self.model, w, initial, actions, noise,
                                                 key_noise, deterministic=True)[1], axis=1)
               for w in weights]
    return sum(returns) / len(returns)

  def plan(self, weights: list, state: LatentState, key: Array) -> Array:
    """The first action of CEM's plan from the posterior ``state`` (batch 1), scored by
    ``plan_objective`` over ``weights``."""
    c = self.config
    plan = cem(functools.partial(self.plan_objective, weights, state), key, horizon=c.horizon,
               action_dim=ACTION_DIM, iterations=c.cem_iterations,
               candidates=c.cem_candidates, top_k=c.cem_top_k)
    return plan[0]

  def _episode(self, key: Array, choose) -> Episode:
    """Runs ``choose(decision_key, episode_key, image, latent, prev_action)`` for every
    decision; the start state depends on ``key`` alone."""
    c = self.config
    key_reset, key_run, key_episode = jax.random.split(key, 3)

    def decide(carry, t):
      env, latent, prev_action = carry
      image = render(env.theta, c.image_size)
      latent, action = choose(jax.random.fold_in(key_run, t), key_episode, image, latent,
                              prev_action)
      next_env, reward = pendulum.repeated_step(env, action[0], c.action_repeat)
      return (next_env, latent, action), (image, action, reward, env.theta_dot)

    latent = self.model.initial_state((1,))
    carry = (pendulum.reset(key_reset), latent, jnp.zeros(ACTION_DIM))
    (env, _, _), (images, actions, rewards, velocities) = jax.lax.scan(
        decide, carry, jnp.arange(c.decisions))
    return Episode(
        images=jnp.concatenate([images, render(env.theta, c.image_size)[None]]),
        prev_actions=jnp.concatenate([jnp.zeros((1, ACTION_DIM)), actions]),
        rewards=jnp.concatenate([jnp.zeros(1), rewards]),
        velocities=jnp.concatenate([velocities, env.theta_dot[None]]))

  def _random_episode(self, key: Array) -> Episode:
    def choose(key, key_episode, image, latent, prev_action):
      return latent, jax.random.uniform(key, (ACTION_DIM,), minval=-1.0, maxval=1.0)
    return self._episode(key, choose)

  def rule_weights(self, params, rule: str, key_decision: Array, key_episode: Array
                   ) -> tuple[object, list]:
    """The weights a decision filters with and the list it plans with, under ``rule``."""
    if rule == "mean":
      return params, [params]
    if rule == "thompson":
      sample = sample_weights(params, key_episode)
      return sample, [sample]
    if rule == "per_decision":
      sample = sample_weights(params, key_decision)
      return sample, [sample]
    keys = jax.random.split(key_decision, self.config.plan_samples)
    return params, [sample_weights(params, k) for k in keys]  # "average"

  def _policy_episode(self, params, key: Array, noise_stddev: Array, rule: str) -> Episode:
    def choose(key, key_episode, image, latent, prev_action):
      key_latent, key_plan, key_explore, key_weights = jax.random.split(key, 4)
      filter_weights, plan_weights = self.rule_weights(params, rule, key_weights, key_episode)
      variables = {"params": filter_weights}
      embed = self.model.apply(variables, image[None], method=WorldModel.encode)
      noise = jax.random.normal(key_latent, (1, self.config.stoch_size))
      latent, _, _ = self.model.apply(variables, latent, prev_action[None], embed, noise, True,
                                      method=WorldModel.observe_step)
      action = self.plan(plan_weights, latent, key_plan)
      action = action + noise_stddev * jax.random.normal(key_explore, action.shape)
      return latent, jnp.clip(action, -1.0, 1.0)
    return self._episode(key, choose)


def memory_of(compiled) -> dict[str, int]:
  """XLA's memory analysis of a compiled program, in bytes."""
  analysis = compiled.memory_analysis()
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
            "generated_code_size_in_bytes")
  memory = {name: int(getattr(analysis, name)) for name in fields}
  memory["total_bytes"] = (memory["argument_size_in_bytes"] + memory["output_size_in_bytes"]
                           + memory["temp_size_in_bytes"])
  return memory
