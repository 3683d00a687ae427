"""The agent's training step learns, and the whole loop runs at toy size."""

import dataclasses

import jax
import numpy as np
import pytest

from meshbayes.planet import report
from meshbayes.planet.agent import Agent, ReplayBuffer
from meshbayes.planet.config import PRESETS
from meshbayes.planet.training import train

TOY = PRESETS["toy"]
BAYESIAN = dataclasses.replace(TOY, estimator="reparameterization")


@pytest.fixture(scope="module")
def agent():
  """The toy Bayesian agent, its programs compiled once for the module."""
  return Agent(BAYESIAN)


def test_loss_falls_on_random_episodes(agent):
  buffer = ReplayBuffer(BAYESIAN, 2)
  for index in range(2):
    buffer.add(agent.random_episode(jax.random.key(index)))
  params, opt_state = agent.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  data_terms, losses = [], []
  for step in range(40):
    params, opt_state, metrics = agent.train_step(params, opt_state, buffer.sample(rng),
                                                  jax.random.key(step), 1.0 / buffer.decisions)
    data_terms.append(float(metrics["image_nll"] + metrics["reward_nll"]))
    losses.append(float(metrics["loss"]))
  assert np.mean(data_terms[-5:]) < 0.5 * np.mean(data_terms[:5])
  assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])  # the weight KL term included
  assert metrics["weight_kl"] > 0
  assert agent.memory["total_bytes"] > agent.memory["argument_size_in_bytes"] > 0


@pytest.fixture(scope="module")
def bayesian_run(agent):
  return train(dataclasses.replace(BAYESIAN, seed=1), agent)


def test_whole_loop_records_every_measure(bayesian_run):
  record = bayesian_run
  episodes = TOY.seed_episodes + TOY.train_episodes
  assert record["curve"]["env_steps"] == [TOY.episode_steps * (i + 1) for i in range(episodes)]
  returns = np.asarray(record["curve"]["return"] + record["eval_returns"])
  # Pendulum's rewards lie in [-16.3, 0] per step.
  assert np.all(returns <= 0) and np.all(returns >= -16.3 * TOY.episode_steps)
  assert record["curve"]["weight_kl"][:TOY.seed_episodes] == [None] * TOY.seed_episodes
  assert record["curve"]["weight_kl"][-1] > 0 and record["final_weight_kl"] > 0
  assert len(record["open_loop_mse"]) == TOY.open_loop_steps
  assert all(0 < e < 1 for e in record["open_loop_mse"])
  assert 0.01 < record["open_loop_blank_mse"] < 0.2  # the rod covers a few percent
  assert np.isfinite(record["velocity_probe_r2"]) and record["velocity_probe_r2"] <= 1
  assert record["train_step_memory"]["total_bytes"] > 0


def test_report_summarizes_seeds_and_ratios(bayesian_run, tmp_path):
  other = dict(bayesian_run, config=dict(bayesian_run["config"], seed=2))
  faster = dict(bayesian_run, train_step_seconds=bayesian_run["train_step_seconds"] / 2,
                train_step_memory={k: v // 2 for k, v in
                                   bayesian_run["train_step_memory"].items()})
  summary = report.summarize({"deterministic": [faster], "reparameterization":
                              [bayesian_run, other]})
  assert summary["agents"]["reparameterization"]["seeds"] == [1, 2]
  ratios = summary["ratios_to_deterministic"]["reparameterization"]
  assert ratios["train_step_time"] == pytest.approx(2.0)
  assert ratios["train_step_memory_total"] == pytest.approx(2.0, rel=1e-3)
  report.plot(summary, str(tmp_path / "planet.png"))
  assert (tmp_path / "planet.png").stat().st_size > 10_000
