"""The side-by-side table from what meshbayes.eval writes (``meshbayes.experiments.compare``,
through its command ``meshbayes.tools.compare_runs``)."""

import json

import pytest

from meshbayes.experiments import compare, selections
from meshbayes.metrics import measures
from meshbayes.tools import compare_runs

pytestmark = pytest.mark.integration

BINS = {"bin_confidence": [0.1, None], "bin_accuracy": [0.2, None], "bin_count": [3.0, 0.0]}


def write_run(directory, predictives, bleu, ece, ood=None, extra=None):
  out = directory / "eval" / "tatoeba_enfr"
  out.mkdir(parents=True)
  interval = lambda x: {"estimate": x, "low": x - 0.01, "high": x + 0.01}
  figures = {"bleu": interval(bleu), "token_ece": interval(ece), "sequence_ece": interval(0.003),
             "calibration_auroc": {"estimate": None, "low": None, "high": None},
             **{name: interval(value) for name, value in (extra or {}).items()}}
  metrics = {"step": 100, "num_samples": 4, "predictives": predictives, "num_sources": 60,
             "num_pairs": 64, "temperature_scaling": {"temperature": 1.234},
             "intervals": {p: figures for p in predictives}}
  if ood:
    metrics["ood_intervals"] = {name: {k: interval(v) for k, v in values.items()}
                                for name, values in ood.items()}
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
  assert ("| BLEU | 12.50 [12.49, 12.51] | 12.50 [12.49, 12.51] | 12.00 [11.99, 12.01] | "
          "12.00 [11.99, 12.01] |") in lines
  assert "| token ECE (%) | 25.00 [24.00, 26.00] | 25.00 [24.00, 26.00] | 5.00 [4.00, 6.00] | " \
      "5.00 [4.00, 6.00] |" in lines
  assert not any(line.startswith("| sequence calibration AUROC") for line in lines)  # all NaN
  # OOD is measured with the headline predictive only.
  assert ("| OOD spanish: AUROC / FPR@95 (%) by mutual information | - | - | "
          "0.900 [0.890, 0.910] / 25.0 | - |") in lines
  assert ("| OOD spanish: AUROC / FPR@95 (%) by total uncertainty | - | - | "
          "0.800 [0.790, 0.810] | - |") in lines
  assert not any("by data uncertainty" in line for line in lines)  # rows of measures present
  assert "| test sources (pairs) | 60 (64) | 60 (64) | 60 (64) | 60 (64) |" in lines
  assert plot.stat().st_size > 0


def test_missing_evaluation_is_a_one_line_error(tmp_path, capsys):
  assert compare_runs.main([str(tmp_path), "--task=tatoeba_enfr"]) == 2
  assert "has no evaluation; run python -m meshbayes.eval" in capsys.readouterr().err


def test_a_measure_is_shown_once_the_registry_has_it(tmp_path, monkeypatch):
  """A new uncertainty measure needs only its registry entry to get its OOD rows; a new
  figure its entry and its row in selections.FIGURE_ROWS, nothing in the table's code."""
  gap = measures.Measure("token_entropy_gap", "token entropy gap (%)", measures.LOWER,
                         measures.TOKEN, measures.FIGURE, 100, ".1f", "a figure to show")
  energy = measures.Measure("energy", "energy", measures.NEITHER, measures.TOKEN,
                            measures.UNCERTAINTY, 1, ".3f", "a measure to show")
  monkeypatch.setattr(measures, "MEASURES", measures.MEASURES + (gap, energy))
  monkeypatch.setattr(selections, "FIGURE_ROWS",
                      selections.FIGURE_ROWS + (("token_entropy_gap", ""),))
  measures.check()
  selections.check()
  write_run(tmp_path / "run", ["model_average"], 12.0, 0.05, extra={"token_entropy_gap": 0.123},
            ood={"spanish": {"auroc_energy": 0.75, "fpr95_energy": 0.5}})
  lines = compare.table(compare.columns([tmp_path / "run"], ["run"],
                                        "tatoeba_enfr")).splitlines()
  last = next(k for k, line in enumerate(lines) if line.startswith("| token ECE (%) |"))
  assert lines[last + 1] == "| token entropy gap (%) | 12.3 [11.3, 13.3] |"  # the table's last
  assert "| OOD spanish: AUROC / FPR@95 (%) by energy | 0.750 [0.740, 0.760] / 50.0 |" in lines
