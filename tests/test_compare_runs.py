"""tools/compare_runs.py: the side-by-side table from what meshbayes.eval writes."""

import json

from meshbayes.tools import compare_runs

BINS = {"bin_confidence": [0.1, None], "bin_accuracy": [0.2, None], "bin_count": [3.0, 0.0]}


def write_run(directory, predictives, bleu, ece, ood=None):
  out = directory / "eval" / "tatoeba_enfr"
  out.mkdir(parents=True)
  token = {"ece": ece, "weighted_ece": ece / 2, "nll": 1.5, "accuracy": 0.6, "brier": 0.5}
  decoding = {"bleu": bleu, "sequence_calibration_error": 0.3,
              "sequence_calibration_error_length_normalized": 0.2}
  metrics = {"step": 100, "num_samples": 4, "predictives": predictives,
             "temperature_scaling": {"temperature": 1.234},
             "token_calibration": {p: token for p in predictives},
             "decoding": {p: decoding for p in predictives}}
  if ood:
    metrics["ood"] = ood
  (out / "metrics.json").write_text(json.dumps(metrics))
  (out / "reliability.json").write_text(json.dumps(
      {p: {"token": BINS, "sequence": BINS} for p in predictives}))


def test_table_has_a_column_per_predictive(tmp_path, capsys):
  write_run(tmp_path / "det", ["posterior_mean", "posterior_mean_temperature_scaled"], 12.5,
            0.25)
  write_run(tmp_path / "bay", ["model_average", "posterior_mean"], 12.0, 0.05,
            ood={"spanish": {"auroc_mutual_information": 0.9, "fpr95_mutual_information": 0.25,
                             "auroc_total_uncertainty": 0.8}})
  plot = tmp_path / "reliability.png"
  assert compare_runs.main([str(tmp_path / "det"), str(tmp_path / "bay"), "--task=tatoeba_enfr",
                            "--names=deterministic,Bayesian", f"--plot={plot}"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ("| metric | deterministic (posterior mean) | deterministic (posterior "
                      "mean, temperature-scaled T=1.23) | Bayesian (model average, S=4) | "
                      "Bayesian (posterior mean) |")
  assert "| BLEU | 12.50 | 12.50 | 12.00 | 12.00 |" in lines
  assert "| token ECE (%) | 25.00 | 25.00 | 5.00 | 5.00 |" in lines
  # OOD is measured with the headline predictive only.
  assert "| OOD spanish: AUROC / FPR@95 (%) by mutual information | - | - | 0.900 / 25.0 | - |" in lines
  assert "| OOD spanish: AUROC / FPR@95 (%) by total uncertainty | - | - | 0.800 | - |" in lines
  assert not any("by data uncertainty" in line for line in lines)  # rows of measures present
  assert plot.stat().st_size > 0


def test_missing_evaluation_is_a_one_line_error(tmp_path, capsys):
  assert compare_runs.main([str(tmp_path), "--task=tatoeba_enfr"]) == 2
  assert "has no evaluation; run python -m meshbayes.eval" in capsys.readouterr().err
