"""``python -m meshbayes.tools.planet`` end to end at toy size: both agents, two seeds."""

import json
import os

import pytest

from meshbayes.tools import planet


@pytest.mark.slow
@pytest.mark.integration
def test_tool_writes_the_report_and_resumes(tmp_path, capsys):
  out = str(tmp_path / "planet")
  summary = planet.main(["--preset=toy", "--seeds=2", f"--out={out}"])
  assert set(summary["agents"]) == {"deterministic", "reparameterization"}
  assert summary["agents"]["reparameterization"]["seeds"] == [0, 1]
  comparison = summary["comparisons"]["reparameterization"]
  assert comparison["seeds"] == [0, 1]
  assert set(comparison["rules"]) == {"mean", "thompson", "average", "per_decision"}
  assert comparison["chosen_rule"] in comparison["rules"]
  assert 0.2 < comparison["train_step_time"]["estimate"] < 5
  assert 0.9 < comparison["train_step_memory_total"] < 2
  with open(os.path.join(out, "planet.json")) as f:
    assert json.load(f)["agents"]["deterministic"]["weight_kl"]["median"][-1] == 0.0
  assert os.path.getsize(os.path.join(out, "planet.png")) > 10_000
  # A rerun with the same settings reuses every finished run: nothing trains again.
  capsys.readouterr()
  again = planet.main(["--preset=toy", "--seeds=2", f"--out={out}"])
  assert "round" not in capsys.readouterr().out
  assert again["agents"] == summary["agents"]
  # Every run's own time, however many calls it took; this call's, only what it ran.
  assert again["runs_wall_seconds"] == pytest.approx(summary["runs_wall_seconds"])
  assert again["total_seconds"] < summary["total_seconds"]


def test_tool_rejects_bad_arguments(capsys):
  with pytest.raises(SystemExit):
    planet.main(["--seeds=0"])
  assert "--seeds=0 must be at least 1" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    planet.main(["--estimators=bayes", "--preset=toy"])
  assert "estimator='bayes'" in capsys.readouterr().err
  # The weight KL's weight is settable like the other fields, and checked the same way.
  with pytest.raises(SystemExit):
    planet.main(["--weight_kl_weight=-1", "--preset=toy"])
  assert "weight_kl_weight=-1.0" in capsys.readouterr().err


def test_planet_keeps_the_posterior_settings_at_their_defaults():
  configs = planet.agent_configs("cpu", ["deterministic", "reparameterization"],
                                 {"weight_kl_weight": 0.0, "train_episodes": 2})
  bayesian, deterministic = configs["reparameterization"], configs["deterministic"]
  # The cpu preset's remedy (initial stddev ratio 0.01) and the override: the Bayesian agent's.
  assert (bayesian.transition_stddev_ratio, bayesian.weight_kl_weight) == (0.01, 0.0)
  # PlaNet reads neither: its config keeps their defaults, as its published runs have them.
  assert (deterministic.transition_stddev_ratio, deterministic.weight_kl_weight) == (0.1, 1.0)
  assert {c.train_episodes for c in configs.values()} == {2}  # shared settings: both agents
