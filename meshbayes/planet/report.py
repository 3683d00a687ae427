"""The comparison of PlaNet and Bayesian PlaNet over seeds: summary numbers and a figure.

``summarize`` reduces the per-seed records of ``training.train`` by agent and compares each
Bayesian agent with the deterministic one, paired by seed: per decision rule the held-out
return difference with its ``LEVEL`` t-interval against ``MARGIN``, the rule chosen on
validation, the power, cost ratios (docs/planet.md, "The comparison"). ``plot`` draws the figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import integrate, stats

from meshbayes.metrics.seed_intervals import t_interval

BASELINE = "deterministic"
MARGIN = 100.0  # return; fixed 2026-11-28 before any run (about 1.5 x PlaNet's seed spread)
LEVEL = 0.90
POWER = 0.80
OPEN_LOOP_SHORT = 15  # predicted decisions of the "short horizon" open-loop figure


def interval_power(sd: float, seeds: int, low: float, high: float, level: float = LEVEL,
                   true_difference: float = 0.0) -> float:
  """The probability that the ``level`` t-interval of the mean of ``seeds`` paired
  differences, each N(``true_difference``, ``sd``^2), lies within ``(low, high)`` (either
  end may be infinite).

  Exact, by integrating over the sample stddev (``s^2 (n - 1) / sd^2`` is chi-square with
  ``n - 1`` df, independent of the mean): for half-width ``h``, the mean must lie in
  ``(low + h, high - h)``.
  """
  if not (sd > 0 and seeds >= 2 and 0 < level < 1 and low < high):
    raise ValueError(f"interval_power: sd={sd!r} must be > 0, seeds={seeds!r} >= 2, "
                     f"level={level!r} in (0, 1) and low={low!r} < high={high!r}")
  df = seeds - 1
  quantile = stats.t.ppf(0.5 + level / 2, df)
  standard_error = sd / math.sqrt(seeds)

  def covered(x):  # x: the chi-square draw
    half = quantile * standard_error * math.sqrt(x / df)
    if high - half <= low + half:
      return 0.0
    inside = (stats.norm.cdf((high - half - true_difference) / standard_error)
              - stats.norm.cdf((low + half - true_difference) / standard_error))
    return inside * stats.chi2.pdf(x, df)

  # Beyond the chi-square value where the interval outgrows (low, high) nothing is covered.
  upper = (df * ((high - low) / (2 * quantile * standard_error)) ** 2
           if math.isfinite(high - low) else stats.chi2.ppf(1 - 1e-12, df))
  return min(1.0, float(integrate.quad(covered, 0.0, upper, limit=200)[0]))


def equivalence_power(sd: float, seeds: int, margin: float = MARGIN, level: float = LEVEL,
                      true_difference: float = 0.0) -> float:
  """``interval_power`` within ``(-margin, margin)``: the chance of the verdict "same task
  performance".

  >>> round(equivalence_power(112.0, 5), 3), round(equivalence_power(112.0, 12), 3)
  (0.205, 0.789)
  """
  return interval_power(sd, seeds, -margin, margin, level, true_difference)


def inferiority_power(sd: float, seeds: int, true_difference: float, margin: float = MARGIN,
                      level: float = LEVEL) -> float:
  """``interval_power`` below ``-margin``: the chance of the verdict "worse by more than
  ``margin``" when the true difference is ``true_difference``.

  >>> round(inferiority_power(200.0, 5, true_difference=-350.0), 3)
  0.741
  """
  return interval_power(sd, seeds, -math.inf, -margin, level, true_difference)


def seeds_needed(sd: float, margin: float = MARGIN, level: float = LEVEL, power: float = POWER,
                 true_difference: float = 0.0, most: int = 100) -> int | None:
  """The fewest seeds (>= 2) whose ``equivalence_power`` reaches ``power``; None beyond
  ``most``.

  >>> seeds_needed(112.0), seeds_needed(60.0)
  (13, 5)
  """
  for seeds in range(2, most + 1):
    if equivalence_power(sd, seeds, margin, level, true_difference) >= power:
      return seeds
  return None


def verdict(low: float, high: float, margin: float = MARGIN) -> str:
  """What a paired interval of returns (Bayesian minus PlaNet) says against ``margin``."""
  if -margin < low and high < margin:
    return f"same task performance (within +-{margin:g})"
  if high < -margin:
    return f"worse by more than {margin:g}"
  if low > margin:
    return f"better by more than {margin:g}"
  return "inconclusive"


def _band(rows: Sequence[Sequence[float]]) -> dict[str, list[float]]:
  """Median and 5-95 percentiles over seeds (rows), per column."""
  values = np.asarray(rows, np.float64)
  return {name: np.percentile(values, q, axis=0).tolist()
          for name, q in (("median", 50), ("p5", 5), ("p95", 95))}


def _interval(values: Sequence[float], level: float) -> dict[str, object]:
  """The mean with its t-interval over seeds (the mean alone for one seed)."""
  values = [float(v) for v in values]
  if len(values) < 2:
    return {"estimate": values[0], "low": None, "high": None, "values": values}
  return {**t_interval(values, level).as_dict(), "values": values}


def _ratio(values: Sequence[float], level: float) -> dict[str, object]:
  """The geometric mean of per-seed ratios with the exponentiated interval of the logs."""
  logs = _interval(np.log(values), level)
  scale = lambda x: None if x is None else float(np.exp(x))
  return {"estimate": scale(logs["estimate"]), "low": scale(logs["low"]),
          "high": scale(logs["high"]), "values": [float(v) for v in values]}


def chosen_rule(runs: Sequence[Mapping]) -> str:
  """The decision rule with the highest mean validation return over ``runs`` (first of
  equals, in the records' order): chosen without the held-out episodes."""
  rules = list(runs[0]["validation_returns"])
  means = {rule: np.mean([np.mean(run["validation_returns"][rule]) for run in runs])
           for rule in rules}
  return max(rules, key=lambda rule: (means[rule], -rules.index(rule)))


def _agent(runs: Sequence[Mapping], level: float) -> dict[str, object]:
  curve = runs[0]["curve"]
  trained = [i for i, kl in enumerate(curve["weight_kl"]) if kl is not None]
  rules = list(runs[0]["eval_returns"])
  chosen = chosen_rule(runs)
  per_seed = lambda key, rule: np.array([np.mean(run[key][rule]) for run in runs])
  return {
      "seeds": [run["config"]["seed"] for run in runs],
      "env_steps": curve["env_steps"],
      "return": _band([run["curve"]["return"] for run in runs]),
      "chosen_rule": chosen,
      "validation_return": {rule: _interval(per_seed("validation_returns", rule), level)
                            for rule in rules},
      "eval_return": {rule: _interval(per_seed("eval_returns", rule), level) for rule in rules},
      # The chosen rule's held-out return minus each other rule's, paired by seed: an
      # exploratory comparison, not the one fixed in advance.
      "chosen_minus_rule": {rule: _interval(per_seed("eval_returns", chosen)
                                            - per_seed("eval_returns", rule), level)
                            for rule in rules if rule != chosen},
      "eval_returns": [run["eval_returns"] for run in runs],
      "weight_kl_env_steps": [curve["env_steps"][i] for i in trained],
      "weight_kl": _band([[run["curve"]["weight_kl"][i] for i in trained] for run in runs]),
      "final_losses": {name: [run["curve"][name][-1] for run in runs]
                       for name in ("loss", "image_nll", "reward_nll", "latent_kl",
                                    "weight_kl")},
      "open_loop_mse": _band([run["open_loop_mse"] for run in runs]),
      "open_loop_blank_mse": float(np.median([run["open_loop_blank_mse"] for run in runs])),
      "velocity_probe_r2": [run["velocity_probe_r2"] for run in runs],
      "train_step_seconds": [run["train_step_seconds"] for run in runs],
      "wall_seconds": [run["wall_seconds"] for run in runs],
      "collect_episode_seconds": [run["collect_episode_seconds"] for run in runs],
      "eval_episode_seconds": {rule: [run["eval_episode_seconds"][rule] for run in runs]
                               for rule in rules},
      # Compiles happen once per agent: the last seed's record holds their total.
      "compile_seconds": float(max(run["compile_seconds"] for run in runs)),
      "train_step_memory": runs[0]["train_step_memory"],
  }


def _paired(base: Sequence[Mapping], runs: Sequence[Mapping], margin: float, level: float
            ) -> dict[str, object]:
  """Bayesian minus PlaNet, seed by seed, over the seeds both have."""
  by_seed = lambda records: {run["config"]["seed"]: run for run in records}
  base, runs = by_seed(base), by_seed(runs)
  seeds = sorted(set(base) & set(runs))
  if not seeds:
    raise ValueError(f"summarize: no seed in common between {sorted(base)} and {sorted(runs)}")
  pairs = [(base[s], runs[s]) for s in seeds]
  baseline_rule = next(iter(pairs[0][0]["eval_returns"]))

  def differences(key, rule):
    return [float(np.mean(r[key][rule]) - np.mean(b[key][baseline_rule])) for b, r in pairs]

  rules = {}
  for rule in pairs[0][1]["eval_returns"]:
    held_out = _interval(differences("eval_returns", rule), level)
    entry = {"held_out": held_out,
             "validation": _interval(differences("validation_returns", rule), level)}
    if held_out["low"] is not None:
      entry["verdict"] = verdict(held_out["low"], held_out["high"], margin)
      entry["sd"] = float(np.std(held_out["values"], ddof=1))
    rules[rule] = entry
  chosen = chosen_rule([r for _, r in pairs])
  power = {}
  if "sd" in rules[chosen] and rules[chosen]["sd"] > 0:
    sd = rules[chosen]["sd"]
    estimate = rules[chosen]["held_out"]["estimate"]
    power = {"sd": sd, "seeds": len(seeds), "estimate": estimate,
             "equivalence_power_at_zero": equivalence_power(sd, len(seeds), margin, level),
             "seeds_needed_at_zero": seeds_needed(sd, margin, level),
             "inferiority_power_at_estimate": (
                 inferiority_power(sd, len(seeds), estimate, margin, level)
                 if estimate < -margin else None)}
  short = lambda run: float(np.mean(run["open_loop_mse"][:OPEN_LOOP_SHORT]))
  whole = lambda run: float(np.mean(run["open_loop_mse"]))
  ratio = lambda name: _ratio([r[name] / b[name] for b, r in pairs], level)
  memory = lambda b, r, field: r["train_step_memory"][field] / b["train_step_memory"][field]
  return {
      "seeds": seeds,
      "rules": rules,
      "chosen_rule": chosen,
      "chosen": rules[chosen],
      "power": power,
      "train_step_time": ratio("train_step_seconds"),
      "wall_time": ratio("wall_seconds"),
      "collect_episode_time": ratio("collect_episode_seconds"),
      "train_step_memory_total": memory(*pairs[0], "total_bytes"),
      "train_step_memory_temp": memory(*pairs[0], "temp_size_in_bytes"),
      "velocity_probe_r2": _interval([r["velocity_probe_r2"] - b["velocity_probe_r2"]
                                      for b, r in pairs], level),
      "open_loop_mse_short": _interval([short(r) - short(b) for b, r in pairs], level),
      "open_loop_mse": _interval([whole(r) - whole(b) for b, r in pairs], level),
  }


def summarize(records: Mapping[str, Sequence[Mapping]], margin: float = MARGIN,
              level: float = LEVEL) -> dict[str, object]:
  """Per agent (``records[estimator]``: one record per seed), then each agent against the
  deterministic one (``comparisons``), paired by seed."""
  for estimator, runs in records.items():
    if not runs:
      raise ValueError(f"summarize: no runs for {estimator!r}")
  summary = {"margin": margin, "level": level,
             "agents": {estimator: _agent(runs, level) for estimator, runs in records.items()}}
  if BASELINE in records:
    summary["comparisons"] = {estimator: _paired(records[BASELINE], runs, margin, level)
                              for estimator, runs in records.items() if estimator != BASELINE}
  return summary


def plot(summary: Mapping, path: str, title: str = "") -> None:
  """Writes the five panels (return, weight KL, open-loop error, velocity probe, held-out
  return per decision rule) to ``path``."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 5, figsize=(21, 3.8))
  agents = summary["agents"]
  labels = []
  for index, (estimator, agent) in enumerate(agents.items()):
    color = f"C{index}"
    label = "PlaNet" if estimator == BASELINE else f"Bayesian PlaNet ({estimator})"
    seeds = len(agent["seeds"])
    for ax, x, band in ((axes[0], agent["env_steps"], agent["return"]),
                        (axes[1], agent["weight_kl_env_steps"], agent["weight_kl"]),
                        (axes[2], np.arange(1, len(agent["open_loop_mse"]["median"]) + 1),
                         agent["open_loop_mse"])):
      ax.plot(x, band["median"], color=color,
              label=f"{label}, {seeds} seed{'s' if seeds > 1 else ''}")
      ax.fill_between(x, band["p5"], band["p95"], color=color, alpha=0.2)
    axes[2].axhline(agent["open_loop_blank_mse"], color=color, linestyle=":", linewidth=1,
                    label="a blank image's error" if index == 0 else None)
    r2 = agent["velocity_probe_r2"]
    axes[3].bar(index, np.median(r2), color=color, alpha=0.6, label=label)
    axes[3].scatter(np.full(len(r2), index), r2, color="black", s=12, zorder=3)
    for rule, entry in agent["eval_return"].items():
      position = len(labels)
      labels.append(("PlaNet" if estimator == BASELINE else "Bayes") + f"\n{rule}")
      axes[4].bar(position, entry["estimate"], color=color, alpha=0.6)
      axes[4].scatter(np.full(len(entry["values"]), position), entry["values"], color="black",
                      s=12, zorder=3)
  axes[0].set(xlabel="environment steps", ylabel="episode return",
              title="return (median, 5-95%)")
  axes[1].set(xlabel="environment steps", ylabel="KL(q(w) || p(w)), nats",
              title="transition weight KL")
  axes[2].set(xlabel="open-loop step (decisions)", ylabel="pixel MSE",
              title="open-loop error, shared episodes")
  axes[3].set(xticks=range(len(agents)), xticklabels=["PlaNet" if e == BASELINE else "Bayesian"
                                                       for e in agents],
              ylabel="R^2 (held-out)", title="velocity probe, shared episodes")
  axes[4].set(xticks=range(len(labels)), ylabel="held-out return (mean per seed)",
              title="held-out return by decision rule")
  axes[4].set_xticklabels(labels, fontsize="small")
  axes[0].legend(fontsize="small")
  axes[2].legend(fontsize="small")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
