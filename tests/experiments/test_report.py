"""The experiment's report (``meshbayes.experiments.report``): its seed section and
verdicts on hand-made evaluations (sequence calibration and the band from the pool's), the
published report read back, the layer kinds of its posterior diagnostics, and the command
that prints the verdicts (``meshbayes.tools.experiment_verdicts``)."""

import json
from pathlib import Path

import pytest

from meshbayes.experiments import report, verdicts
from tests.experiments.seed_evaluations import evaluation, seed_results  # noqa: F401


def test_seed_groups_pair_evaluations_by_seed_number(seed_results, tmp_path):
  seed_results["bayesian_seed10@final"] = tmp_path / "bayesian_seed10_final"
  groups = report._seed_groups(seed_results, "final")
  assert list(groups["Bayesian layers"]) == [0, 1, 2, 10]  # by number, not by name
  assert groups["deterministic"][2] == tmp_path / "deterministic_seed2_final"
  assert set(groups) == {"deterministic", "temperature-scaled", "Bayesian layers",
                         "Bayesian layers (mean)", "Bayesian layers, temperature-scaled",
                         "Bayesian layers (mean), temperature-scaled"}
  # Every seed group is a column of the report.
  titles = {title for columns in report.COLUMNS.values()
            for title in columns.values()}
  assert set(report.SEED_GROUPS) <= titles

def test_the_report_has_the_seed_section_in_markdown_and_json(seed_results):
  summary = {}
  section = "\n".join(report._seed_section(seed_results, "final", summary))
  assert "## Training seeds (end of the budget)" in section
  assert "### Seed-level differences against the deterministic model" in section
  assert "| BLEU, mean of seeds | 22.00 [17.03, 26.97] |" in section
  assert set(summary["seeds"]) == {"checkpoint", "means", "differences"}
  welch = summary["seeds"]["differences"]["Bayesian layers"]["bleu"]["welch"]
  assert welch["seed_counts"] == [3, 3]
  assert "### One verdict per claim" in section
  assert summary["verdicts"]["Bayesian layers vs deterministic"]["claims"]["translation"][
      "verdict"] == "helps"  # BLEU +3, 4, 2 by seed
  json.dumps(summary)  # report.json takes it as it is
  # One seed per method: no section.
  assert report._seed_section(
      {k: v for k, v in seed_results.items() if "_seed" not in k}, "final", {}) == []


def test_layer_kinds_of_the_transformers_weights():
  assert report.layer_kind(
      "decoder/layers/encoder_decoder_attention/query/kernel") == "cross_attention"
  assert report.layer_kind("encoder/layers/attention/out/kernel") == "self_attention"
  assert report.layer_kind("decoder/layers/mlp/wi/kernel") == "mlp"
  assert report.layer_kind("token_embedder/embedding") == "embedding"
  assert report.layer_kind("decoder/layers/pre_cross_attention_norm/scale") == "norm"
  assert report.layer_kind("decoder/relpos_bias/rel_embedding") == "relative_positions"


def test_the_verdicts_command_prints_and_writes_the_reports_verdicts(seed_results, tmp_path,
                                                                     monkeypatch, capsys):
  from meshbayes.tools import experiment_verdicts

  table, summary = report.seed_verdicts(seed_results, "final")
  section = {}
  assert table in "\n".join(report._seed_section(seed_results, "final", section))
  assert summary == section["verdicts"]
  assert report.seed_verdicts({k: v for k, v in seed_results.items() if "_seed" not in k},
                              "final") == ("", {})
  monkeypatch.setattr(experiment_verdicts, "read_budget", lambda out: report.Budget(
      train_steps=4, eval_period=2, checkpoints=("final",)))
  monkeypatch.setattr(experiment_verdicts, "result_dirs", lambda budget, out: seed_results)
  assert experiment_verdicts.main([str(tmp_path), f"--json={tmp_path / 'v.json'}"]) == 0
  assert capsys.readouterr().out == table + "\n"
  assert json.loads((tmp_path / "v.json").read_text()) == json.loads(json.dumps(
      {"verdicts": summary, "band_verdicts": {}}))


POOL_GAPS = {"deterministic": [-0.010, -0.012, -0.009], "bayesian": [0.001, -0.001, 0.0005]}


def _pool(tmp_path):
  """The pool's evaluations of the deterministic and Bayesian seeds (keyed as the plan's
  ``pool_result_dirs``), each seed's signed gap and what the verdicts read beside it."""
  results = {}
  for recipe, gaps in POOL_GAPS.items():
    predictives = (["posterior_mean"] if recipe == "deterministic"
                   else ["model_average", "posterior_mean"])
    for k, gap in enumerate(gaps):
      key = f"{recipe}@final" if k == 0 else f"{recipe}_seed{k}@final"
      directory = evaluation(tmp_path / "pool" / key.replace("@", "_"), predictives,
                             [20.0] * len(predictives))
      metrics = json.loads((directory / "metrics.json").read_text())
      for figures in metrics["intervals"].values():
        figures.update({name: {"estimate": value, "low": value, "high": value}
                        for name, value in (
                            ("fraction_signed_gap", gap), ("fraction_signed_gap_z", gap / 0.002),
                            ("fraction_signed_gap_p_value", 0.01), ("fraction_ece", 0.012),
                            ("fraction_ece_null_high", 0.009), ("reference_fraction", 0.018),
                            ("reference_fraction_positives", 430.0))})
      (directory / "metrics.json").write_text(json.dumps(metrics))
      results[key] = directory
  results["bayesian_seed2@final"] = tmp_path / "pool" / "given_up"  # the stop rule's: none
  return results


def test_sequence_calibration_and_the_band_come_from_the_pool(seed_results, tmp_path):
  summary = {}
  section = "\n".join(report._seed_section(seed_results, "final", summary, _pool(tmp_path)))
  sequence = summary["verdicts"]["Bayesian layers vs deterministic"]["claims"][
      "sequence calibration"]
  gap = sequence["figures"][0]
  assert gap["figure"] == "abs_fraction_signed_gap"
  assert gap["difference"]["seed_counts"] == [2]  # seed 2's pool evaluation was given up
  assert gap["difference"]["estimate"] == pytest.approx((0.001 - 0.010 + 0.001 - 0.012) / 2)
  # The test split has no signed gaps: without a pool, no sequence verdict.
  assert "sequence calibration" not in report.seed_verdicts(seed_results, "final")[1][
      "Bayesian layers vs deterministic"]["claims"]
  assert "### One predictive against its band" in section
  assert "| predictive (pool) |" in section
  band = summary["band_verdicts"]
  assert band["deterministic"]["verdict"] == "overconfident"  # -1.03% over 3 seeds
  assert list(band["deterministic"]["seeds"]) == [0, 1, 2]
  assert band["Bayesian layers"]["verdict"] == "calibrated within noise"
  assert list(band["Bayesian layers"]["seeds"]) == [0, 1]
  json.dumps(summary)


def test_the_published_report_is_read_back_and_judged_by_todays_rules():
  """The 2026-11-29 report (made with the old rule: one figure's interval excluding 0):
  BLEU +3.69 [+0.85, +6.53] with p = 0.031 on 2 df helped translation then. Holm over the
  comparison's five deciding figures (BLEU, token ECE, PRR, two OOD AUROCs) cannot tell."""
  published = json.loads((Path(__file__).parents[2] / "docs" / "uncertainty" /
                          "bayesian_worth_it" / "report.json").read_text())
  values = report.seed_values_from_summary(published)
  assert values["temperature-scaled"]["bleu"] == values["deterministic"]["bleu"]  # no T
  old = published["verdicts"]["Bayesian layers vs deterministic"]["claims"]["translation"]
  assert old["verdict"] == "helps"
  _, summary = verdicts.verdict_table(values)
  headline = summary["Bayesian layers vs deterministic"]
  bleu = headline["claims"]["translation"]["figures"][0]
  for key in ("estimate", "low", "high", "p_value"):
    assert bleu["difference"][key] == pytest.approx(old["figures"][0]["difference"][key])
  assert headline["family_size"] == 5 and bleu["holm_p_value"] == pytest.approx(0.1529, abs=1e-4)
  assert headline["claims"]["translation"]["verdict"] == "cannot tell"
  assert bleu["detectable"] == pytest.approx(8.37, abs=0.01)  # BLEU points, 3 seeds
  with pytest.raises(ValueError, match="the report has no seeds/means"):
    report.seed_values_from_summary({})
