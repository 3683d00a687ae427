"""The agent's training step learns, and the whole loop runs at toy size."""

import dataclasses

import jax
import numpy as np
import pytest

from meshbayes.planet import report
from meshbayes.planet.agent import Agent, ReplayBuffer
from meshbayes.planet.config import DECISION_RULES, PRESETS
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
    data_terms.append(float(metrics["image_nll"] + BAYESIAN.reward_scale * metrics["reward_nll"]))
    losses.append(float(metrics["loss"]))
  assert np.mean(data_terms[-5:]) < 0.75 * np.mean(data_terms[:5])
  # The weight KL over 40 decisions dominates this loss and falls at Adam's pace.
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5])
  assert metrics["weight_kl"] > 0
  assert agent.memory["total_bytes"] > agent.memory["argument_size_in_bytes"] > 0


@pytest.fixture(scope="module")
def bayesian_run(agent):
  return train(dataclasses.replace(BAYESIAN, seed=1), agent)


def test_whole_loop_records_every_measure(bayesian_run):
  record = bayesian_run
  episodes = TOY.seed_episodes + TOY.train_episodes
  assert record["curve"]["env_steps"] == [TOY.episode_steps * (i + 1) for i in range(episodes)]
  assert set(record["eval_returns"]) == set(record["validation_returns"]) == set(DECISION_RULES)
  assert all(len(r) == TOY.eval_episodes for r in record["eval_returns"].values())
  assert all(len(r) == TOY.validation_episodes for r in record["validation_returns"].values())
  returns = np.asarray(record["curve"]["return"]
                       + [r for rule in record["eval_returns"].values() for r in rule])
  # Pendulum's rewards lie in [-16.3, 0] per step.
  assert np.all(returns <= 0) and np.all(returns >= -16.3 * TOY.episode_steps)
  assert record["curve"]["weight_kl"][:TOY.seed_episodes] == [None] * TOY.seed_episodes
  assert record["curve"]["weight_kl"][-1] > 0 and record["final_weight_kl"] > 0
  assert len(record["open_loop_mse"]) == TOY.open_loop_steps
  assert all(0 < e < 1 for e in record["open_loop_mse"])
  assert 0.01 < record["open_loop_blank_mse"] < 0.2  # the rod covers a few percent
  assert np.isfinite(record["velocity_probe_r2"]) and record["velocity_probe_r2"] <= 1
  assert record["train_step_memory"]["total_bytes"] > 0
  assert all(s > 0 for s in record["eval_episode_seconds"].values())


def test_both_agents_of_a_seed_meet_the_same_episodes(agent, bayesian_run):
  """The probe's episodes (like the start states) depend on the seed alone."""
  planet = train(dataclasses.replace(TOY, seed=1, train_episodes=0))
  assert planet["open_loop_blank_mse"] == bayesian_run["open_loop_blank_mse"]
  other_seed = train(dataclasses.replace(TOY, seed=2, train_episodes=0))
  assert other_seed["open_loop_blank_mse"] != bayesian_run["open_loop_blank_mse"]


def _record(seed, base_return, rules, step_seconds, r2):
  """A hand-made record of one seed: returns by rule, times, the probe's R^2."""
  return {"config": {"seed": seed},
          "curve": {"env_steps": [1, 2], "return": [-1.0, -2.0], "weight_kl": [None, 1.0],
                    "loss": [1.0, 0.5], "image_nll": [1.0, 0.4], "reward_nll": [0.1, 0.05],
                    "latent_kl": [1.0, 1.0]},
          "validation_returns": {r: [base_return + v] for r, (v, _) in rules.items()},
          "eval_returns": {r: [base_return + e - 10, base_return + e + 10]
                           for r, (_, e) in rules.items()},
          "eval_episode_seconds": {r: 1.0 for r in rules},
          "open_loop_mse": [0.01] * 20, "open_loop_blank_mse": 0.05,
          "velocity_probe_r2": r2, "train_step_seconds": step_seconds, "wall_seconds": 10.0,
          "collect_episode_seconds": 2.0, "compile_seconds": 3.0,
          "train_step_memory": {"total_bytes": 100, "temp_size_in_bytes": 10}}


def test_report_pairs_seeds_chooses_on_validation_and_reads_the_margin(tmp_path):
  # PlaNet: -200 per seed. Bayesian: 'mean' wins on validation, 'thompson' on held-out
  # (the held-out returns must not choose).
  base = [_record(s, -200.0, {"mean": (0.0, 0.0)}, 1.0, 0.9) for s in range(3)]
  gaps = {0: -20.0, 1: 10.0, 2: -50.0}  # 'mean' minus PlaNet per seed, held-out
  bayes = [_record(s, -200.0, {"mean": (5.0, gaps[s]), "thompson": (-5.0, gaps[s] + 300)},
                   1.2 + 0.1 * s, 0.95) for s in range(3)]
  summary = report.summarize({"deterministic": base, "reparameterization": bayes})
  comparison = summary["comparisons"]["reparameterization"]
  assert comparison["chosen_rule"] == "mean"
  chosen = comparison["chosen"]["held_out"]
  values = list(gaps.values())
  half = 2.919986 * np.std(values, ddof=1) / np.sqrt(3)  # t_{0.95, 2}
  assert chosen["estimate"] == pytest.approx(np.mean(values))
  assert chosen["high"] - chosen["estimate"] == pytest.approx(half, rel=1e-5)
  # -20 +- 50.6: within the margin; 'thompson' (ignored by the choice) beyond it.
  assert comparison["chosen"]["verdict"] == "same task performance (within +-100)"
  assert comparison["rules"]["thompson"]["verdict"] == "better by more than 100"
  assert comparison["power"]["seeds_needed_at_zero"] == report.seeds_needed(
      np.std(values, ddof=1))
  assert comparison["power"]["inferiority_power_at_estimate"] is None  # -20: not below -100
  # Costs: per-seed ratios 1.2, 1.3, 1.4, their geometric mean.
  assert comparison["train_step_time"]["estimate"] == pytest.approx((1.2 * 1.3 * 1.4) ** (1 / 3))
  assert comparison["velocity_probe_r2"]["estimate"] == pytest.approx(0.05)
  assert summary["agents"]["reparameterization"]["chosen_rule"] == "mean"
  # The chosen rule against the others, paired by seed: 'mean' minus 'thompson' is -300.
  against = summary["agents"]["reparameterization"]["chosen_minus_rule"]
  assert list(against) == ["thompson"] and against["thompson"]["estimate"] == pytest.approx(-300)
  assert summary["agents"]["deterministic"]["chosen_minus_rule"] == {}
  report.plot(summary, str(tmp_path / "planet.png"))
  assert (tmp_path / "planet.png").stat().st_size > 10_000


@pytest.mark.parametrize("low, high, want", [
    (-60.0, 40.0, "same task performance (within +-100)"),
    (-300.0, -120.0, "worse by more than 100"),
    (120.0, 300.0, "better by more than 100"),
    (-150.0, -20.0, "inconclusive"),
])
def test_verdicts_against_the_margin(low, high, want):
  assert report.verdict(low, high) == want


def test_equivalence_power_matches_simulated_intervals():
  """The exact power against 20,000 simulated experiments of 6 seeds (t-intervals)."""
  rng = np.random.default_rng(0)
  sd, seeds, trials = 112.0, 6, 20_000
  draws = rng.normal(20.0, sd, (trials, seeds))
  half = 2.015048 * draws.std(axis=1, ddof=1) / np.sqrt(seeds)  # t_{0.95, 5}
  mean = draws.mean(axis=1)
  simulated = np.mean((mean - half > -100) & (mean + half < 100))
  exact = report.equivalence_power(sd, seeds, true_difference=20.0)
  assert abs(simulated - exact) < 4 * np.sqrt(exact * (1 - exact) / trials)
  # "Worse by more than 100" when the truth is -250: the interval's upper end below -100.
  draws = rng.normal(-250.0, sd, (trials, seeds))
  half = 2.015048 * draws.std(axis=1, ddof=1) / np.sqrt(seeds)
  simulated = np.mean(draws.mean(axis=1) + half < -100)
  exact = report.inferiority_power(sd, seeds, true_difference=-250.0)
  assert 0.3 < exact < 0.95
  assert abs(simulated - exact) < 4 * np.sqrt(exact * (1 - exact) / trials)


def test_the_weight_kl_warms_up_over_rounds():
  config = dataclasses.replace(BAYESIAN, train_episodes=3, weight_kl_warmup_rounds=2,
                               weight_kl_weight=0.5, seed=4)
  assert [config.weight_kl_factor(r) for r in range(3)] == [0.5, 1.0, 1.0]
  curve = train(config)["curve"]
  for round_index in range(3):
    entry = TOY.seed_episodes + round_index  # the episode collected after the round
    decisions = (TOY.seed_episodes + round_index) * TOY.decisions  # D during the round
    data = (curve["image_nll"][entry] + TOY.reward_scale * curve["reward_nll"][entry]
            + curve["latent_term"][entry])
    kl_term = curve["loss"][entry] - data
    want = 0.5 * config.weight_kl_factor(round_index) * curve["weight_kl"][entry] / decisions
    assert kl_term == pytest.approx(want, rel=1e-3), round_index
  with pytest.raises(ValueError, match="weight_kl_warmup_rounds=-1"):
    dataclasses.replace(TOY, weight_kl_warmup_rounds=-1)
