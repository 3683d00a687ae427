"""The comparison of PlaNet and Bayesian PlaNet over seeds: summary numbers and a figure.

``summarize`` reduces the per-seed records of ``training.train`` by agent: the return over
environment steps (median and 5-95 percentiles over seeds), the held-out return, the
weight KL over training, the open-loop error per predicted step, the velocity probe's
R^2, and the cost of being Bayesian as ratios to the deterministic agent (train-step time,
whole-run time, a planned episode's time, and the XLA memory analysis of the compiled
train step). ``plot`` draws the four panels of docs/planet.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

BASELINE = "deterministic"


def _band(rows: Sequence[Sequence[float]]) -> dict[str, list[float]]:
  """Median and 5-95 percentiles over seeds (rows), per column."""
  values = np.asarray(rows, np.float64)
  return {name: np.percentile(values, q, axis=0).tolist()
          for name, q in (("median", 50), ("p5", 5), ("p95", 95))}


def _median_or_none(values: Sequence[float | None]) -> float | None:
  present = [v for v in values if v is not None]
  return float(np.median(present)) if present else None


def summarize(records: Mapping[str, Sequence[Mapping]]) -> dict[str, object]:
  """Per agent (``records[estimator]``: one record per seed), then the ratios of each
  agent to the deterministic one."""
  agents = {}
  for estimator, runs in records.items():
    if not runs:
      raise ValueError(f"summarize: no runs for {estimator!r}")
    curve = runs[0]["curve"]
    trained = [i for i, kl in enumerate(curve["weight_kl"]) if kl is not None]
    agents[estimator] = {
        "seeds": [run["config"]["seed"] for run in runs],
        "env_steps": curve["env_steps"],
        "return": _band([run["curve"]["return"] for run in runs]),
        "eval_return_median": float(np.median([np.mean(run["eval_returns"]) for run in runs])),
        "eval_returns": [run["eval_returns"] for run in runs],
        "weight_kl_env_steps": [curve["env_steps"][i] for i in trained],
        "weight_kl": _band([[run["curve"]["weight_kl"][i] for i in trained] for run in runs]),
        "open_loop_mse": _band([run["open_loop_mse"] for run in runs]),
        "open_loop_blank_mse": _median_or_none([run.get("open_loop_blank_mse")
                                                for run in runs]),
        "velocity_probe_r2": [run["velocity_probe_r2"] for run in runs],
        "velocity_probe_r2_median": float(np.median([run["velocity_probe_r2"] for run in runs])),
        "train_step_seconds": float(np.median([run["train_step_seconds"] for run in runs])),
        "wall_seconds": float(np.median([run["wall_seconds"] for run in runs])),
        "collect_episode_seconds": float(np.median([run["collect_episode_seconds"]
                                                    for run in runs])),
        # Compiles happen once per agent: the last seed's record holds their total.
        "compile_seconds": float(max(run["compile_seconds"] for run in runs)),
        "train_step_memory": runs[0]["train_step_memory"],
    }
  summary = {"agents": agents}
  if BASELINE in agents:
    base = agents[BASELINE]
    summary["ratios_to_deterministic"] = {
        estimator: {
            "train_step_time": agent["train_step_seconds"] / base["train_step_seconds"],
            "wall_time": agent["wall_seconds"] / base["wall_seconds"],
            "collect_episode_time": (agent["collect_episode_seconds"]
                                     / base["collect_episode_seconds"]),
            "train_step_memory_total": (agent["train_step_memory"]["total_bytes"]
                                        / base["train_step_memory"]["total_bytes"]),
            "train_step_memory_temp": (agent["train_step_memory"]["temp_size_in_bytes"]
                                       / base["train_step_memory"]["temp_size_in_bytes"]),
        } for estimator, agent in agents.items() if estimator != BASELINE}
  return summary


def plot(summary: Mapping, path: str, title: str = "") -> None:
  """Writes the four panels (return, weight KL, open-loop error, velocity probe) to ``path``."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
  agents = summary["agents"]
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
    if agent["open_loop_blank_mse"] is not None:
      axes[2].axhline(agent["open_loop_blank_mse"], color=color, linestyle=":", linewidth=1,
                      label="a blank image's error" if index == 0 else None)
    r2 = agent["velocity_probe_r2"]
    axes[3].bar(index, np.median(r2), color=color, alpha=0.6, label=label)
    axes[3].scatter(np.full(len(r2), index), r2, color="black", s=12, zorder=3)
  axes[0].set(xlabel="environment steps", ylabel="episode return",
              title="return (median, 5-95%)")
  axes[1].set(xlabel="environment steps", ylabel="KL(q(w) || p(w)), nats",
              title="transition weight KL")
  axes[2].set(xlabel="open-loop step (decisions)", ylabel="pixel MSE",
              title="open-loop prediction error")
  axes[3].set(xticks=range(len(agents)), xticklabels=["PlaNet" if e == BASELINE else "Bayesian"
                                                       for e in agents],
              ylabel="R^2 (held-out)", title="linear probe of the angular velocity")
  axes[0].legend(fontsize="small")
  axes[2].legend(fontsize="small")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
