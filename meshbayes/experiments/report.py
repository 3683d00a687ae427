"""The report of an experiment (``meshbayes.experiments.run``): tables with intervals,
paired differences against the deterministic model, error detection, OOD detection, the
seed spread, training curves, posterior diagnostics and figures, from what its runs and
evaluations wrote (each evaluation's per-source items: ``meshbayes.evaluation.items``).

Writes ``OUT/report.md``, ``OUT/report.json`` and ``OUT/figures/*.png``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshbayes import metrics
from meshbayes.experiments import (band_verdicts, compare, recipes, selections, tables,
                                   verdicts)
from meshbayes.experiments.plan import (CHECKPOINTS, Budget, best_step, convergence, read_json,
                                        stopped_at, validation_curve, write_json)
from meshbayes.metrics import measures as registry
from meshbayes.runtime import metrics_writer
from meshbayes.training import checkpoints
from meshbayes.training.posterior_diagnostics import posterior_moments

# Column titles of each method's evaluated predictives (meshbayes.experiments.recipes; others
# are left out: MC dropout's "posterior mean" would be the deterministic model again).
COLUMNS = {name: dict(recipes.get(name).columns) for name in recipes.names()}
# Weights grouped by the kind of layer they belong to, for the posterior diagnostics.
# The first marker found in a weight's path decides (norms' paths name their attention too).
LAYER_KINDS = (("norm", "_norm/"), ("cross_attention", "encoder_decoder_attention/"),
               ("self_attention", "attention/"), ("mlp", "mlp/"), ("embedding", "embedder/"),
               ("logits", "logits"), ("relative_positions", "relpos"))
QUANTILES = (0.05, 0.5, 0.95)
# Columns whose other training seeds are evaluated too: column title -> (the method of
# seed 0's evaluation, predictive): the deterministic model's (its other seeds are the
# ensemble's members) and every column of a method trained at several seeds.
SEED_GROUPS = {
    title: (name, predictive) for name in recipes.names()
    if name == "deterministic" or recipes.get(name).seed_spread
    for predictive, title in recipes.get(name).columns}


def layer_kind(name: str) -> str:
  """The kind of layer a weight's path names (``self_attention``, ``mlp``, ...)."""
  for kind, marker in LAYER_KINDS:
    if marker in name:
      return kind
  return "other"


def posterior_diagnostics(step_dir: Path) -> dict[str, dict[str, Any]]:
  """Per kind of layer: the number of weights and quantiles of the posterior stddev and
  of |mean| / stddev (empty for a run without a posterior)."""
  _, moments = posterior_moments(checkpoints.read_arrays(step_dir),
                                 checkpoints.read_meta(step_dir))
  grouped: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
  for name, (mean, stddev) in moments.items():
    grouped.setdefault(layer_kind(name), []).append((mean.ravel(), stddev.ravel()))
  result = {}
  for kind, parts in sorted(grouped.items()):
    mean = np.concatenate([m for m, _ in parts])
    stddev = np.concatenate([s for _, s in parts])
    snr = np.abs(mean) / stddev
    result[kind] = {"weights": int(mean.size),
                    "stddev": dict(zip(map(str, QUANTILES), np.quantile(stddev, QUANTILES)
                                       .tolist())),
                    "abs_mean_over_stddev": dict(zip(map(str, QUANTILES),
                                                     np.quantile(snr, QUANTILES).tolist())),
                    "abs_mean": float(np.mean(np.abs(mean)))}
  return result


def training_log(run_dir: Path) -> list[dict[str, float]]:
  path = run_dir / "metrics.jsonl"
  return metrics_writer.read_lines(path) if path.is_file() else []


def step_seconds(run_dir: Path) -> float:
  """The mean logged step time of a run (its steady state: compilation is not in it)."""
  times = [r["step_seconds"] for r in training_log(run_dir) if "step_seconds" in r]
  return float(np.mean(times)) if times else float("nan")


def kl_per_token(run_dir: Path) -> list[tuple[int, float]]:
  """``(step, KL / training tokens)`` over training (Bayesian layers), from the logged KL
  term and its weight (the term is ``kl_weight * KL / D``)."""
  return [(int(r["step"]), r["kl_term"] / r["kl_weight"]) for r in training_log(run_dir)
          if r.get("kl_weight", 0) > 0 and "kl_term" in r]


def _columns(results: Mapping[str, Path], checkpoint: str) -> list[compare.Column]:
  """compare_runs' columns of one checkpoint's evaluations, renamed per ``COLUMNS``."""
  cols = []
  for key, result_dir in results.items():
    method, at = key.split("@")
    if at != checkpoint or method not in COLUMNS:
      continue
    run_metrics, reliability = compare.load(result_dir, "")
    for predictive, title in COLUMNS[method].items():
      if predictive in run_metrics["predictives"]:
        if predictive.endswith("temperature_scaled"):
          title += f" (T={compare.temperature(run_metrics, predictive):.2f})"
        cols.append(compare.Column(title, run_metrics, predictive,
                                        reliability[predictive], result_dir))
  return cols


def _cost_rows(results: Mapping[str, Path], checkpoint: str, runs: Path, costs: dict,
               cols) -> list[str]:
  """Rows of each column's training cost: step time against the deterministic run's, and
  the CPU time of every run it needed ("-" where one's time was not recorded)."""
  base = step_seconds(runs / "deterministic") if (runs / "deterministic").is_dir() else None
  ratios, cpu = [], []
  for col in cols:
    method = next(m for m, names in COLUMNS.items() if col.title.split(" (")[0] in names.values())
    recipe = recipes.get(method).trained_by
    names = (sorted(p.name for p in runs.glob(f"{recipe}*"))
             if recipes.get(method).combines_runs else [recipe])
    seconds = step_seconds(runs / names[0])
    ratios.append(f"{seconds / base:.2f}" if base else "-")
    recorded = [costs[n]["cpu_seconds"] for n in names if "cpu_seconds" in costs.get(n, {})]
    cpu.append(f"{sum(recorded) / 60:.0f}" if len(recorded) == len(names) else "-")
  return [f"| training step time / deterministic | {' | '.join(ratios)} |",
          f"| training CPU minutes (all runs it needs) | {' | '.join(cpu)} |"]


def plot_curves(runs: Path, path: Path) -> None:
  """Validation NLL (and training NLL) against steps for every run; the best steps marked;
  and the Bayesian run's KL per training token."""
  plt = metrics.reliability._pyplot()
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
    curve = validation_curve(run_dir)
    if not curve:
      continue
    steps, nll = zip(*curve)
    line, = left.plot(steps, nll, label=f"{run_dir.name} (validation)")
    train = [(r["step"], r["nll"]) for r in training_log(run_dir) if "nll" in r]
    if train:
      left.plot(*zip(*train), color=line.get_color(), alpha=0.4, linestyle=":")
    best = best_step(run_dir)
    left.plot([best], [dict(curve)[best]], "o", color=line.get_color())
    kl = kl_per_token(run_dir)
    if any(value > 0 for _, value in kl):  # runs with Bayesian layers
      right.plot(*zip(*kl), label=run_dir.name)
  left.set(xlabel="step", ylabel="token NLL (nats)",
           title="validation (solid; dot: best) and training (dotted) NLL")
  left.legend(fontsize=7)
  right.set(xlabel="step", ylabel="KL / training tokens (nats)", title="KL per training token")
  if right.lines:
    right.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_ood(cols: Sequence[compare.Column], path: Path,
             measures: Sequence[str] = selections.OOD_PLOT_MEASURES) -> None:
  """AUROC of telling each OOD set from in-domain inputs, per column and measure, with the
  95% intervals as error bars."""
  plt = metrics.reliability._pyplot()  # pylint: disable=protected-access
  headline = [c for c in cols if c.is_headline and c.metrics.get("ood_intervals")]
  sets = sorted({name for c in headline for name in c.metrics["ood_intervals"]})
  if not sets:
    return
  fig, axes = plt.subplots(1, len(sets), figsize=(4 * len(sets), 3.6), sharey=True,
                           squeeze=False)
  width = 0.8 / len(measures)
  for ax, ood_set in zip(axes[0], sets):
    for i, measure in enumerate(measures):
      entries = [c.metrics["ood_intervals"].get(ood_set, {}).get(
          registry.family_name(registry.AUROC, measure)) for c in headline]
      values = np.array([e["estimate"] if e else np.nan for e in entries])
      errors = np.array([[e["estimate"] - e["low"], e["high"] - e["estimate"]] if e
                         else [np.nan, np.nan] for e in entries]).T
      ax.bar(np.arange(len(headline)) + i * width, values, width, yerr=errors, capsize=2,
             label=measure.replace("_", " "))
    ax.axhline(0.5, color="grey", linewidth=0.8)
    ax.set_xticks(np.arange(len(headline)) + 0.4 - width / 2)
    ax.set_xticklabels([c.title for c in headline], rotation=35, ha="right", fontsize=7)
    ax.set_title(ood_set.replace("_", " "))
    ax.set_ylim(0, 1)
  axes[0][0].set_ylabel("OOD AUROC")
  axes[0][-1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _diagnostics_table(diagnostics: Mapping[str, Mapping[str, Any]]) -> str:
  lines = ["| run | layers | weights | stddev 5% / 50% / 95% | mean abs | "
           "abs(mean)/stddev 5% / 50% / 95% |", "|---|---|---|---|---|---|"]
  for run, kinds in diagnostics.items():
    for kind, d in kinds.items():
      q = lambda name: " / ".join(f"{d[name][str(x)]:.3g}" for x in QUANTILES)
      lines.append(f"| {run} | {kind} | {d['weights']:,} | {q('stddev')} | "
                   f"{d['abs_mean']:.3g} | {q('abs_mean_over_stddev')} |")
  return "\n".join(lines)


def _convergence_table(runs: Path, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
  """Per run with a posterior and layer group: the final median stddev and its relative
  change over the last tenth of the run, with the validation NLL and negative ELBO."""
  lines = ["| run | validation NLL | NLL + KL/D | layers | median stddev | change, last tenth |",
           "|---|---|---|---|---|---|"]
  summary = {}
  for name in names:
    end = summary[name] = convergence(runs / name)
    for group, g in end.get("groups", {}).items():
      lines.append(f"| {name} | {end['nll']:.4f} | {end['neg_elbo']:.4f} | {group} | "
                   f"{g['median']:.3g} | {100 * g['change']:+.1f}% (step {g['from_step']} to "
                   f"{end['step']}) |")
  return "\n".join(lines), {k: v for k, v in summary.items() if v}


def _seed_groups(results: Mapping[str, Path], checkpoint: str) -> dict[str, dict[int, Path]]:
  """Each ``SEED_GROUPS`` column's evaluations at ``checkpoint`` by seed number (seed 0:
  the method's own evaluation; seed k: run ``<recipe>_seed<k>``'s), for the columns with
  more than one seed."""
  groups = {}
  for title, (method, _) in SEED_GROUPS.items():
    first = results.get(f"{method}@{checkpoint}")
    recipe = recipes.get(method).trained_by
    others = {int(match[1]): directory for key, directory in results.items()
              if (match := re.fullmatch(rf"{re.escape(recipe)}_seed(\d+)@{checkpoint}", key))}
    if first is not None and others:
      groups[title] = {0: first, **dict(sorted(others.items()))}
  return groups


def seed_verdicts(results: Mapping[str, Path], checkpoint: str,
                  pool: Mapping[str, Path] | None = None) -> tuple[str, dict[str, Any]]:
  """The verdict table (``verdicts.verdict_table``) of the evaluations ``results`` at
  ``checkpoint`` (``pool``: the pool's evaluations, keyed as ``results``, which decide
  sequence calibration); empty without a column of several seeds."""
  groups = _seed_groups(results, checkpoint)
  if not groups:
    return "", {}
  return verdicts.verdict_table(_seed_values(groups), _pool_values(pool, checkpoint))


def seed_band(results: Mapping[str, Path], checkpoint: str,
              pool: Mapping[str, Path] | None = None) -> tuple[str, dict[str, Any]]:
  """Each predictive against its band (``band_verdicts.band_table``) at ``checkpoint``: on
  the pool's evaluations when there are, else on the test split's; empty without a
  predictive of two seeds."""
  pool_values = _pool_values(pool, checkpoint)
  if pool_values is not None:
    return band_verdicts.band_table(pool_values, "pool")
  groups = _seed_groups(results, checkpoint)
  return band_verdicts.band_table(_seed_values(groups), "test split") if groups else ("", {})


def _band_lines(table: str) -> list[str]:
  if not table:
    return []
  return ["### One predictive against its band", "",
          "Per predictive, each seed's reference-fraction signed gap (mean label minus mean p; "
          "negative: overconfident), their mean with its t-interval over seeds and its t-test "
          "against 0, Holm over the predictives: overconfident, underconfident or calibrated "
          "within noise. Beside it, per seed, the z-test of its gap over the sources and its "
          "one-sided reference-fraction ECE against its null band's 97.5% point. One-sample "
          f"tests: the {registry.MIN_POSITIVES}-positive gate of the paired comparisons does "
          "not apply; the power is stated instead (`meshbayes/experiments/band_verdicts.py`).",
          "", table, ""]


def _seed_values(groups: Mapping[str, Mapping[int, Path]]
                 ) -> dict[str, dict[str, dict[int, float]]]:
  return tables.seed_values(groups, {t: SEED_GROUPS[t][1] for t in groups})


def _pool_values(pool: Mapping[str, Path] | None, checkpoint: str
                 ) -> dict[str, dict[str, dict[int, float]]] | None:
  """The seed values of the pool's evaluations (None without a pool). A pool evaluation
  the stop rule gave up has no ``metrics.json``: its seed is left out (``not_run.json``
  says so)."""
  done = {key: d for key, d in (pool or {}).items() if (d / "metrics.json").is_file()}
  groups = _seed_groups(done, checkpoint) if done else {}
  return _seed_values(groups) if groups else None


def seed_values_from_summary(summary: Mapping[str, Any]
                             ) -> dict[str, dict[str, dict[int, float]]]:
  """``tables.seed_values``' figures again from a written ``report.json`` (its
  ``seeds/means``: each column's per-seed values of the headline figures; the counts of
  positives are not there), titles without their fitted temperature: a published report's
  verdicts can be recomputed by today's rules.

  Raises:
    ValueError: ``summary`` has no seed section.
  """
  means = summary.get("seeds", {}).get("means")
  if not means:
    raise ValueError("seed_values_from_summary: the report has no seeds/means (an "
                     "experiment of one seed per method)")
  return {tables.group_title(title): {name: {int(k): v for k, v in entry["seeds"].items()
                                             if v is not None}
                                      for name, entry in figures.items() if "seeds" in entry}
          for title, figures in means.items()}


def _seed_section(results: Mapping[str, Path], checkpoint: str, summary: dict[str, Any],
                  pool: Mapping[str, Path] | None = None) -> list[str]:
  """The report's section on training seeds at ``checkpoint``: each column's seed 0 beside
  its mean over seeds, the seed-level differences against the deterministic model, the
  verdicts per claim and each predictive against its band (on the pool when there is one;
  none without a column of several seeds)."""
  groups = _seed_groups(results, checkpoint)
  if not groups:
    return []
  values = _seed_values(groups)
  pool_values = _pool_values(pool, checkpoint)
  spread, means = tables.seed_table(_columns(results, checkpoint), values)
  tests, differences = tables.seed_difference_table(values)
  verdict_text, summary["verdicts"] = verdicts.verdict_table(values, pool_values)
  summary["seeds"] = {"checkpoint": checkpoint, "means": means, "differences": differences}
  band, summary["band_verdicts"] = seed_band(results, checkpoint, pool)
  where = ("end of the budget" if checkpoint == "final" else
           "each run's best validation checkpoint")
  section = [f"## Training seeds ({where})", "",
             "Seed 0: the run the tables above report, with its 95% bootstrap interval over "
             "test sources (how much the figure moves with the test set). Mean of seeds: the "
             "mean over the column's training runs of seeds 0, 1, ... with its Student-t 95% "
             "interval, t(0.975, n - 1) s / sqrt(n) for n seeds (how much it moves with the "
             "training seed). A single realization (one run, or the deep ensemble, which "
             "mixes every seed) has no interval over seeds.", "", spread, ""]
  if tests:
    section += ["### Seed-level differences against the deterministic model", "",
                "The mean over a column's seeds minus the deterministic model's (its seeds: "
                "the deep ensemble's members), with Welch's t interval (unequal variances, "
                "Welch-Satterthwaite df; every seed of each side) and the paired t interval "
                "over the seed numbers both have (seed k of every recipe is trained on the "
                "same batches in the same order: SEED sets the data order), each with its "
                "two-sided p-value: better or worse when the interval excludes 0, uncorrected "
                "(the verdicts below correct).", "", tests, ""]
  if verdict_text:
    section += ["### One verdict per claim", "",
                "Each comparison sets a column against the control that would explain its "
                "effect away; each figure is the paired t-test over the seeds both have, "
                "Holm's correction at family-wise 0.05 over the deciding figures of the "
                "comparison (translation: BLEU; token calibration: token ECE; sequence "
                "calibration, on the pool only: the absolute reference-fraction signed gap "
                "and the reference-fraction ECE; error detection: the PRR; OOD: the AUROCs by "
                "the beam-level and the token-level total uncertainty). A claim helps (hurts) "
                "when one of its figures is rejected in its favour (against it) and none the "
                "other way, mixed when both, cannot tell otherwise, with the true difference "
                "it would detect with probability 0.8 at Holm's smallest level. Reported "
                "figures (NLL, the exact-match ECE) decide nothing. A paired sequence figure "
                f"on fewer than {registry.MIN_POSITIVES} positive labels in a seed is "
                "underpowered (`meshbayes/experiments/verdicts.py`).", "", verdict_text, ""]
  return section + _band_lines(band)


def write(out: Path, budget: Budget, results: Mapping[str, Path],
          pool: Mapping[str, Path] | None = None) -> Path:
  """Writes the report of an experiment under ``out`` (``pool``: its evaluations on the
  pool, keyed as ``results``); returns ``report.md``'s path."""
  runs, figures = out / "runs", out / "figures"
  figures.mkdir(exist_ok=True)
  costs = read_json(out / "costs.json")
  evaluated = next((read_json(d / "metrics.json") for k, d in results.items()
                    if k.endswith(f"@{budget.seed_checkpoint}")), {})
  split = ("the whole test split" if budget.eval_batches is None
           else f"the test split's first {budget.eval_batches} "
                f"batch{'es' if budget.eval_batches > 1 else ''} of 64 pairs")
  if "num_sources" in evaluated:
    split += f": {evaluated['num_sources']:,} sources, {evaluated['num_pairs']:,} pairs"
  sections = [f"# The uncertainty experiment ({budget.train_steps} steps per run)", "",
              f"Every cell: the figure on the test sources ({split}) and its 95% bootstrap "
              "interval "
              f"({budget.bootstrap_resamples:,} resamples of the sources; OOD: of the in- and "
              "out-of-distribution inputs).", ""]
  summary: dict[str, Any] = {"tables": {}, "paired": {}, "ood_chosen_on_half": {},
                             "best_steps": {}, "posterior": {}}
  for name in budget.runs:
    summary["best_steps"][name] = best_step(runs / name)
  reported = []  # each reported checkpoint's evaluation directories
  for checkpoint in CHECKPOINTS:
    cols = _columns(results, checkpoint)
    if not cols:
      continue
    if [c.directory for c in cols] in reported:  # every best checkpoint is the final one
      sections += ["## Every method at each run's best validation checkpoint", "",
                   "Every run's best validation checkpoint (lowest validation NLL) is its "
                   "last: the tables above are also the early-stopped ones.", ""]
      continue
    reported.append([c.directory for c in cols])
    text = compare.table(cols).splitlines()
    text[-1:-1] = _cost_rows(results, checkpoint, runs, costs, cols)
    what = ("at the end of the budget" if checkpoint == "final" else
            "at each run's best validation checkpoint (lowest validation NLL)")
    paired, summary["paired"][checkpoint] = tables.paired_table(
        cols, budget.bootstrap_resamples)
    ood, summary["ood_chosen_on_half"][checkpoint] = tables.ood_table(
        cols, budget.bootstrap_resamples)
    sections += [f"## Every method {what}", "", *text, "",
                 "### Paired differences against the deterministic model", "",
                 "Each method's figure minus the deterministic model's on the same resampled "
                 "sources: better or worse when the interval excludes 0, else within noise.",
                 "", paired, "", "### Error detection (prediction rejection ratio of the "
                 "sentence-BLEU error)", "", tables.error_detection_table(cols), "",
                 "### OOD detection: measures fixed in advance, and one chosen on held-out "
                 "inputs", "", ood, ""]
    summary["tables"][checkpoint] = "\n".join(text)
    metrics.plot_token_and_sequence_reliability(
        {c.title: compare.reliability_arrays(c.reliability) for c in cols},
        figures / f"reliability_{checkpoint}.png", title=f"reliability, {checkpoint} checkpoints")
    plot_ood(cols, figures / f"ood_{checkpoint}.png")
    tables.plot_rejection(cols, figures / f"rejection_{checkpoint}.png")
    sections += [f"![reliability](figures/reliability_{checkpoint}.png)",
                 f"![OOD AUROC](figures/ood_{checkpoint}.png)",
                 f"![rejection curves](figures/rejection_{checkpoint}.png)", ""]
  sections += _seed_section(results, budget.seed_checkpoint, summary, pool)
  plot_curves(runs, figures / "curves.png")
  sections += ["## Training curves", "", "![curves](figures/curves.png)", ""]
  if budget.patience:
    summary["stopped_at"] = {name: stopped_at(runs / name) for name in budget.runs}
    sections += [f"Early stopping: a run stops after {budget.patience} validation passes "
                 f"(every {budget.eval_period} steps) without a lower validation NLL; the "
                 f"cap is {budget.train_steps} steps.", "",
                 "| run | best validation step | stopped at |", "|---|---|---|",
                 *(f"| {name} | {summary['best_steps'][name]} | "
                   + (f"{stop} |" if stop is not None else
                      f"**the cap** ({budget.train_steps}) |")
                   for name, stop in summary["stopped_at"].items()), ""]
  else:
    sections += ["Best validation step per run: " + ", ".join(
        f"{k} {v}" for k, v in summary["best_steps"].items()), ""]
  for name in ("bayesian", "ivon"):
    if name in budget.runs:
      summary["posterior"][name] = posterior_diagnostics(checkpoints.find_step_dir(runs / name))
  if summary["posterior"]:
    table, summary["convergence"] = _convergence_table(
        runs, [n for n in budget.runs if n.startswith(("bayesian", "ivon"))])
    sections += ["## Posterior diagnostics (final checkpoints)", "",
                 _diagnostics_table(summary["posterior"]), "",
                 "Convergence: the median posterior stddev of each layer group at the "
                 "trainer's last validation pass and its change over the last tenth of the "
                 "run; a posterior still moving there is not the ELBO's optimum.", "",
                 table, ""]
  summary["costs"] = costs
  write_json(out / "report.json", summary)
  report = out / "report.md"
  report.write_text("\n".join(sections))
  return report


def read_budget(out: Path) -> Budget:
  """The budget of the experiment in ``out``, from its ``budget.json``.

  Raises:
    ValueError: ``out`` holds no experiment.
  """
  budget_json = read_json(out / "budget.json")
  if not budget_json:
    raise ValueError(f"{out} holds no experiment (no budget.json)")
  budget_json.pop("preset")
  budget_json.pop("bindings")
  if "best_checkpoint" in budget_json:  # an experiment from before Budget.checkpoints
    budget_json["checkpoints"] = CHECKPOINTS[:2 if budget_json.pop("best_checkpoint") else 1]
  return Budget(**{k: tuple(v) if isinstance(v, list) else v for k, v in budget_json.items()})
