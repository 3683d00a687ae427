"""The experiment's report (``meshbayes.experiments.report``): its seed section and
verdicts on hand-made evaluations, the layer kinds of its posterior diagnostics, and the
command that prints the verdicts (``meshbayes.tools.experiment_verdicts``)."""

import json

from meshbayes.experiments import report
from tests.experiments.seed_evaluations import seed_results  # noqa: F401


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
  assert json.loads((tmp_path / "v.json").read_text()) == json.loads(json.dumps(summary))
