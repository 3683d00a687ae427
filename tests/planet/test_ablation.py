"""The ablation's cells, effects and rule, and its command end to end at toy size."""

import copy
import json
import os
import shutil

import pytest

from meshbayes.planet import ablation
from meshbayes.planet.config import PRESETS
from meshbayes.tools import planet_ablation

# Mean held-out return per cell; each seed adds the same offset to every cell, and F the
# seed's noise, so effects are exact and vary by seed.
CELL_RETURNS = {"F": -500.0, "P": -200.0, "S": -400.0, "K": -300.0, "SK": -100.0, "T": -480.0}


def _records(seeds=(0, 1, 2, 3)):
  records = {cell: {} for cell in CELL_RETURNS}
  for seed in seeds:
    for cell, value in CELL_RETURNS.items():
      noise = 10.0 * seed if cell == "F" else 0.0
      ret = value + 50.0 * seed + noise
      records[cell][seed] = {
          "eval_returns": {"mean": [ret - 5, ret + 5], "thompson": [0.0]},
          "final_weight_kl": 0.0 if cell == "P" else 100.0,
          "final_stddev_ratio": {} if cell == "P" else {"rssm/transition_input": 1.5},
          "shared_fit": {kind: {"image_nll": 10.0 + (cell != "P"), "reward_nll": 0.1,
                                "latent_kl": 1.0} for kind in ("mean", "sampled")}}
  return records


def test_effects_are_the_designed_contrasts_with_their_verdicts():
  effects = ablation.effects(_records())
  # F gets 10 * seed: its mean over seeds 0-3 is 15 above CELL_RETURNS["F"].
  want = {"initial_stddev": 0.5 * ((-400 + 485) + (-100 + 300)),
          "weight_kl": 0.5 * ((-300 + 485) + (-100 + 400)),
          "interaction": 0.5 * ((-100 + 300) - (-400 + 485)),
          "data": -480 + 485, "both_minus_planet": -100 + 200}
  for name, value in want.items():
    assert effects[name]["estimate"] == pytest.approx(value), name
    assert effects[name]["seeds"] == [0, 1, 2, 3]
    assert effects[name]["low"] <= value <= effects[name]["high"]
  assert effects["weight_kl"]["verdict"] == "a cause"  # [226, 259]: above 0, above 140
  assert effects["interaction"]["verdict"] == "a cause, not a major one"
  assert effects["data"]["verdict"] == "not a major cause"
  assert effects["both_minus_planet"]["verdict"] == "not worse than PlaNet by half the gap"


def test_effects_use_only_seeds_with_every_cell():
  records = _records()
  del records["SK"][3]
  effects = ablation.effects(records)
  assert effects["initial_stddev"]["seeds"] == [0, 1, 2]
  assert effects["data"]["seeds"] == [0, 1, 2, 3]
  del records["T"][1], records["T"][2], records["T"][3]
  assert ablation.effects(records)["data"]["verdict"] == "too few seeds"


@pytest.mark.parametrize("low, high, want", [
    (1.0, 500.0, "a cause"), (1.0, 139.0, "a cause, not a major one"),
    (-1.0, 139.0, "not a major cause"), (-1.0, 140.0, "inconclusive")])
def test_factor_verdicts_at_the_margins(low, high, want):
  assert ablation.factor_verdict(low, high) == want


def test_summary_pairs_the_fit_with_planet():
  summary = ablation.summarize(_records(), {"F": {0: True}})
  fit = summary["fit_minus_planet"]["SK"]
  assert fit["mean/image_nll"]["estimate"] == pytest.approx(1.0)
  assert fit["sampled/latent_kl"]["estimate"] == pytest.approx(0.0)
  assert "P" not in summary["fit_minus_planet"]
  assert summary["cells"]["K"]["settings"] == {"weight_kl_weight": 0.0}
  assert summary["cells"]["K"]["final_stddev_ratio"] == {"rssm/transition_input": 1.5}
  assert summary["published_identical"] == {"F": {0: True}}


def test_cells_change_only_their_settings():
  base = PRESETS["cpu"]
  # The cells change the agent as published (initial stddev ratio 0.1), not the preset's
  # remedy (0.01): F, P and K are the published runs' configs whatever the preset says.
  assert base.transition_stddev_ratio == 0.01
  assert ablation.cell_config(base, "F") == base.__class__(estimator="reparameterization")
  assert ablation.cell_config(base, "P") == base.__class__(estimator="deterministic")
  assert ablation.cell_config(base, "K").transition_stddev_ratio == 0.1
  sk = ablation.cell_config(base, "SK")
  assert (sk.transition_stddev_ratio, sk.weight_kl_weight, sk.collect_rule) == (0.01, 0.0,
                                                                                  "thompson")
  assert ablation.cell_config(base, "T").collect_rule == "mean"
  with pytest.raises(ValueError, match="cell='X' is not one of F, P, S, K, SK, T"):
    ablation.cell_config(base, "X")


def test_command_compares_reruns_with_published_runs(tmp_path, capsys):
  out, published = str(tmp_path / "ablation"), tmp_path / "published"
  summary = planet_ablation.main(["--preset=toy", "--seeds=1", "--cells=F,P", f"--out={out}"])
  assert summary["cells"]["F"]["seeds"] == [0] and summary["published_identical"] == {}
  # The runs as if published under their estimators' names, one of them tampered with.
  published.mkdir()
  shutil.copy(os.path.join(out, "runs", "F_seed0.json"), published / "reparameterization_seed0.json")
  with open(os.path.join(out, "runs", "P_seed0.json")) as f:
    planet = json.load(f)
  changed = copy.deepcopy(planet)
  changed["eval_returns"]["mean"][0] += 1.0
  (published / "deterministic_seed0.json").write_text(json.dumps(changed))
  capsys.readouterr()
  again = planet_ablation.main(["--preset=toy", "--seeds=1", "--cells=F,P", f"--out={out}",
                                f"--published={published}"])
  printed = capsys.readouterr().out
  assert "round" not in printed  # both runs reused
  assert again["published_identical"] == {"F": {0: True}, "P": {0: False}}
  assert "F seed 0" in printed and "identical to the published run" in printed
  assert "DIFFERS from the published run" in printed
  with open(os.path.join(out, "ablation.json")) as f:
    assert json.load(f)["cells"]["P"]["return"]["values"] == [
        sum(planet["eval_returns"]["mean"]) / len(planet["eval_returns"]["mean"])]


def test_command_rejects_bad_arguments(tmp_path, capsys):
  with pytest.raises(SystemExit):
    planet_ablation.main(["--cells=F,X"])
  assert "cell='X' is not one of" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    planet_ablation.main([f"--published={tmp_path / 'none'}"])
  assert "is not a directory" in capsys.readouterr().err
