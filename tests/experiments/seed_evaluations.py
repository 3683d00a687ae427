"""Hand-made evaluations of several training seeds, as ``meshbayes.eval`` writes them, for
the seed tables' and the report's tests."""

import json

import pytest

# BLEU of each run's predictives (the other figures absent).
BLEU = {"deterministic": [20.0, 22.0, 24.0], "bayesian": [23.0, 26.0, 26.0]}


def evaluation(directory, predictives, bleu, ood=None):
  """An evaluation directory as ``meshbayes.eval`` writes it, reduced to what the seed
  tables read: each predictive's BLEU with a bootstrap interval (+-1), and OOD AUROCs (by
  the beam's total uncertainty 0.1 above the token-level one)."""
  directory.mkdir(parents=True)
  metrics = {"predictives": list(predictives), "num_sources": 2000, "num_pairs": 2950,
             "intervals": {p: {"bleu": {"estimate": value, "low": value - 1, "high": value + 1}}
                           for p, value in zip(predictives, bleu)}}
  if ood is not None:
    aurocs = {"auroc_total_uncertainty": ood, "auroc_beam_total_uncertainty": ood + 0.1}
    metrics["ood"] = {"spanish": aurocs}
    metrics["ood_intervals"] = {"spanish": {name: {
        "estimate": value, "low": value - 0.05, "high": value + 0.05}
        for name, value in aurocs.items()}}
  if "posterior_mean_temperature_scaled" in predictives:
    metrics["temperature_scaling"] = {"temperature": 1.1}
  (directory / "metrics.json").write_text(json.dumps(metrics))
  (directory / "reliability.json").write_text(json.dumps({p: {} for p in predictives}))
  return directory

@pytest.fixture
def seed_results(tmp_path):
  """Final evaluations of three deterministic seeds (seed 0 with temperature scaling, the
  others as the ensemble's members), the ensemble, and three Bayesian seeds."""
  det, bayes = BLEU["deterministic"], BLEU["bayesian"]
  results = {
      "deterministic@final": evaluation(
          tmp_path / "deterministic_final",
          ["posterior_mean", "posterior_mean_temperature_scaled"], [det[0], det[0] + 0.5],
          ood=0.60),
      "ensemble@final": evaluation(tmp_path / "ensemble_final", ["model_average"], [25.0],
                                    ood=0.70),
      "bayesian@final": evaluation(tmp_path / "bayesian_final",
                                    ["model_average", "posterior_mean"], [bayes[0], 21.0],
                                    ood=0.65)}
  for k in (1, 2):
    results[f"deterministic_seed{k}@final"] = evaluation(
        tmp_path / f"deterministic_seed{k}_final", ["posterior_mean"], [det[k]], ood=0.6 + k / 100)
    results[f"bayesian_seed{k}@final"] = evaluation(
        tmp_path / f"bayesian_seed{k}_final", ["model_average", "posterior_mean"],
        [bayes[k], 21.0 + k], ood=0.65 + k / 50)
  return results
