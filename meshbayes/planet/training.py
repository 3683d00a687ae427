"""One agent trained from scratch and evaluated; ``train`` returns the run's JSON-ready record.

Seed episodes, then rounds of ``train_steps`` gradient steps and one collected episode;
then every decision rule acts, without noise, from validation start states (where a rule
is chosen) and held-out ones (where it is scored). Start states and probe episodes depend
on the seed alone, so both agents of a seed meet the same ones; after each round (and at
the start) the world model is scored on the probe episodes and its stddevs read
(``diagnostics``). Times exclude compiles and those measurements.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.planet import diagnostics, probes
from meshbayes.planet.agent import Agent, Episode, ReplayBuffer
from meshbayes.planet.config import PlanetConfig

Array = jax.Array


def _blocked(tree):
  return jax.block_until_ready(tree)


def train(config: PlanetConfig, agent: Agent | None = None,
          log: Callable[[str], None] | None = None) -> dict[str, object]:
  """Trains and evaluates one agent with ``config.seed``; ``agent`` reuses compiled
  functions of an equal config (seed aside)."""
  agent = agent or Agent(config)
  if dataclasses.replace(agent.config, seed=config.seed) != config:
    raise ValueError("train: the agent was built for another config: "
                     f"{agent.config} (seed aside) is not {config}")
  log = log or (lambda message: None)
  start, compiled_before = time.perf_counter(), agent.compile_seconds
  key_init, key_collect, key_train, key_validation, key_eval, key_probe = jax.random.split(
      jax.random.key(config.seed), 6)
  rng = np.random.default_rng(config.seed)
  fan_in_scaled = config.transition_prior == "fan_in_scaled"
  params, opt_state = agent.init(key_init)
  buffer = ReplayBuffer(config, config.seed_episodes + config.train_episodes)
  curve = {"env_steps": [], "return": [], "weight_kl": [], "loss": [], "image_nll": [],
           "reward_nll": [], "latent_kl": [], "latent_term": [], "shared_fit": [],
           "stddev_ratio": []}
  timing = {"train_seconds": 0.0, "train_steps_timed": 0, "collect_seconds": 0.0,
            "collect_episodes": 0, "diagnostic_seconds": 0.0}
  probe = [_blocked(agent.random_episode(jax.random.fold_in(key_probe, index)))
           for index in range(config.probe_episodes)]
  probe = {name: jnp.stack([getattr(e, name) for e in probe]) for name in Episode._fields}
  fit_on_probe = _probe_fit(agent, probe, jax.random.fold_in(key_probe, config.probe_episodes))

  def collected(episode: Episode, metrics: dict[str, float] | None) -> None:
    buffer.add(episode)
    curve["env_steps"].append(buffer.episodes * config.episode_steps)
    curve["return"].append(episode.total_return)
    for name in ("weight_kl", "loss", "image_nll", "reward_nll", "latent_kl", "latent_term"):
      curve[name].append(None if metrics is None else metrics[name])
    compiled, tic = agent.compile_seconds, time.perf_counter()
    curve["shared_fit"].append({name: float(value) for name, value in
                                fit_on_probe(params, None, True).items()})
    curve["stddev_ratio"].append(diagnostics.stddev_ratios(params, fan_in_scaled))
    timing["diagnostic_seconds"] += (time.perf_counter() - tic
                                     - (agent.compile_seconds - compiled))

  for index in range(config.seed_episodes):
    collected(_blocked(agent.random_episode(jax.random.fold_in(key_collect, index))), None)
  step = 0
  for round_index in range(config.train_episodes):
    sums = {}
    for _ in range(config.train_steps):
      batch = buffer.sample(rng)
      compiled = agent.compile_seconds
      tic = time.perf_counter()
      params, opt_state, metrics = _blocked(agent.train_step(
          params, opt_state, batch, jax.random.fold_in(key_train, step),
          config.weight_kl_factor(round_index) / buffer.decisions))
      if agent.compile_seconds == compiled:  # not the call that compiled
        timing["train_seconds"] += time.perf_counter() - tic
        timing["train_steps_timed"] += 1
      step += 1
      for name, value in metrics.items():
        sums[name] = sums.get(name, 0.0) + float(value)
    metrics = {name: value / config.train_steps for name, value in sums.items()}
    compiled = agent.compile_seconds
    tic = time.perf_counter()
    episode = _blocked(agent.policy_episode(
        params, jax.random.fold_in(key_collect, config.seed_episodes + round_index),
        config.exploration_noise))
    timing["collect_seconds"] += time.perf_counter() - tic - (agent.compile_seconds - compiled)
    timing["collect_episodes"] += 1
    collected(episode, metrics)
    log(f"{config.estimator} seed {config.seed} round {round_index + 1}/"
        f"{config.train_episodes}: return {episode.total_return:.1f}, "
        f"loss {metrics['loss']:.2f}, weight KL {metrics['weight_kl']:.1f}")

  # Training and collection, less the compiles they did (the first seed of an agent
  # compiles) and the measurements between rounds.
  wall_seconds = (time.perf_counter() - start - (agent.compile_seconds - compiled_before)
                  - timing["diagnostic_seconds"])
  validation_returns, eval_returns, eval_seconds = _rule_returns(
      config, agent, params, key_validation, key_eval, log)

  half = config.probe_episodes // 2  # the first half fits the probe, the second scores
  errors = agent.call_compiled(
      "open_loop_error", functools.partial(probes.open_loop_error, agent.model,
                                           context=config.open_loop_context,
                                           steps=config.open_loop_steps),
      params, probe["images"][half:], probe["prev_actions"][half:])
  feats = np.asarray(agent.call_compiled(
      "posterior_features", functools.partial(probes.posterior_features, agent.model), params,
      probe["images"], probe["prev_actions"]))
  flat = lambda x: x.reshape(-1, x.shape[-1])
  velocities = np.asarray(probe["velocities"])
  r2 = probes.linear_probe_r2(flat(feats[:half]), velocities[:half].reshape(-1),
                              flat(feats[half:]), velocities[half:].reshape(-1))
  test_images = np.asarray(probe["images"])[half:]
  return {
      "config": dataclasses.asdict(config),
      "curve": curve,
      "validation_returns": validation_returns,
      "eval_returns": eval_returns,
      "eval_episode_seconds": eval_seconds,
      "open_loop_mse": np.asarray(errors).tolist(),
      # The error of predicting a blank image: where a prediction has lost the rod.
      "open_loop_blank_mse": float(np.mean(np.square(test_images[
          :, config.open_loop_context:config.open_loop_context + config.open_loop_steps]))),
      "velocity_probe_r2": r2,
      "final_weight_kl": float(agent.weight_kl(params)),
      "final_stddev_ratio": curve["stddev_ratio"][-1],  # measured on the final parameters
      "shared_fit": diagnostics.shared_fit(
          lambda key, deterministic: fit_on_probe(params, key, deterministic), config.bayesian,
          jax.random.fold_in(key_probe, config.probe_episodes + 1)),
      "train_step_seconds": timing["train_seconds"] / max(1, timing["train_steps_timed"]),
      "train_seconds": timing["train_seconds"],
      "collect_seconds": timing["collect_seconds"],
      "collect_episode_seconds": timing["collect_seconds"] / max(1, timing["collect_episodes"]),
      "compile_seconds": agent.compile_seconds,
      "train_step_memory": agent.memory,
      "wall_seconds": wall_seconds,
  }


def _rule_returns(config: PlanetConfig, agent: Agent, params, key_validation: Array,
                  key_eval: Array, log: Callable[[str], None]) -> tuple[dict, dict, dict]:
  """Every decision rule's returns, without noise, from the validation and the held-out
  start states, and its seconds per held-out episode (compiles excluded)."""
  validation_returns, eval_returns, eval_seconds = {}, {}, {}
  for rule in config.decision_rules:
    validation_returns[rule] = [
        _blocked(agent.policy_episode(params, jax.random.fold_in(key_validation, index), 0.0,
                                      rule)).total_return
        for index in range(config.validation_episodes)]
    compiled, tic = agent.compile_seconds, time.perf_counter()
    eval_returns[rule] = [
        _blocked(agent.policy_episode(params, jax.random.fold_in(key_eval, index), 0.0,
                                      rule)).total_return
        for index in range(config.eval_episodes)]
    eval_seconds[rule] = ((time.perf_counter() - tic - (agent.compile_seconds - compiled))
                          / config.eval_episodes)
    log(f"{config.estimator} seed {config.seed} rule {rule}: validation "
        f"{np.mean(validation_returns[rule]):.1f}, held-out {np.mean(eval_returns[rule]):.1f}")
  return validation_returns, eval_returns, eval_seconds


def _probe_fit(agent: Agent, probe: dict[str, Array], key: Array):
  """``(params, weight_key, deterministic) -> diagnostics.fit_terms`` on the probe episodes
  from their first decision on (the start entry has no reward), under latent noise drawn
  from ``key`` (the same for every call and agent of a seed); ``weight_key`` None: the
  posterior mean."""
  episodes = {name: probe[name][:, 1:] for name in ("images", "prev_actions", "rewards")}
  noise = jax.random.normal(key, episodes["images"].shape[:2] + (agent.config.stoch_size,))

  def fit(params, weight_key, deterministic: bool):
    name = "probe_fit_mean" if deterministic else "probe_fit_sampled"
    weight_key = jax.random.key(0) if weight_key is None else weight_key  # unused at the mean
    return agent.call_compiled(
        name, functools.partial(diagnostics.fit_terms, agent.model, deterministic=deterministic),
        params, episodes, noise, weight_key)
  return fit
