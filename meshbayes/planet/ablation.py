"""Why Bayesian PlaNet falls behind PlaNet: the factorial ablation and its rule, fixed before
the runs (docs/results/2026-11-29-planet-ablation-design.md).

Cells change the published Bayesian agent (``F``) one setting at a time or two together;
``P`` is PlaNet. The response is a seed's mean held-out return under the ``mean`` decision
rule; effects are contrasts of the cells, paired by seed, each with its ``LEVEL``
t-interval over seeds, read against ``0`` and ``MAJOR`` (half the published gap).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from meshbayes.metrics.seed_intervals import t_interval
from meshbayes.planet.config import PlanetConfig
from meshbayes.planet.diagnostics import FIT_TERMS
from meshbayes.planet.run_files import recorded_config

CELLS: dict[str, dict[str, object]] = {
    "F": {},                                       # as published (2026-11-28)
    "P": {"estimator": "deterministic"},           # PlaNet
    "S": {"transition_stddev_ratio": 0.01},        # initial stddev 10x smaller
    "K": {"weight_kl_weight": 0.0},                # no weight KL
    "SK": {"transition_stddev_ratio": 0.01, "weight_kl_weight": 0.0},
    "T": {"collect_rule": "mean"},                 # collect by the posterior mean
}
"""Each cell's settings over the published Bayesian agent (``PUBLISHED_SETTINGS``)."""
PUBLISHED_SETTINGS: dict[str, object] = {"transition_stddev_ratio": 0.1}
"""The ``cpu`` preset's settings as published on 2026-11-28 that the remedy changed since."""
BAYESIAN_ESTIMATOR = "reparameterization"
PUBLISHED = {"F": BAYESIAN_ESTIMATOR, "P": "deterministic"}
"""Cells that repeat a published run, by the estimator name of its run files."""
RULE = "mean"
LEVEL = 0.90
MAJOR = 140.0  # return: half of the published gap of 281, fixed with the design

# effect name -> ({cell: coefficient}, what a positive value means)
EFFECTS: dict[str, tuple[dict[str, float], str]] = {
    "initial_stddev": ({"S": 0.5, "F": -0.5, "SK": 0.5, "K": -0.5},
                       "a 10x smaller initial stddev raises the return"),
    "weight_kl": ({"K": 0.5, "F": -0.5, "SK": 0.5, "S": -0.5},
                  "dropping the weight KL raises the return"),
    "interaction": ({"SK": 0.5, "K": -0.5, "S": -0.5, "F": 0.5},
                    "the smaller stddev helps more without the KL than with it"),
    "data": ({"T": 1.0, "F": -1.0},
             "collecting by the posterior mean raises the return"),
    "both_minus_planet": ({"SK": 1.0, "P": -1.0},
                          "both changes together beat PlaNet"),
}


def cell_config(base: PlanetConfig, cell: str) -> PlanetConfig:
  """``base`` (a preset) at the published Bayesian agent's settings, changed as ``cell``
  says."""
  if cell not in CELLS:
    raise ValueError(f"ablation: cell={cell!r} is not one of {', '.join(CELLS)}")
  return dataclasses.replace(base, **{**PUBLISHED_SETTINGS, "estimator": BAYESIAN_ESTIMATOR,
                                      **CELLS[cell]}).canonical()


def factor_verdict(low: float, high: float, major: float = MAJOR) -> str:
  """The design's rule for one effect's interval (positive: the change raises the return).

  >>> factor_verdict(20.0, 300.0), factor_verdict(-50.0, 90.0), factor_verdict(-10.0, 200.0)
  ('a cause', 'not a major cause', 'inconclusive')
  >>> factor_verdict(10.0, 100.0)
  'a cause, not a major one'
  """
  cause, minor = low > 0, high < major
  if cause and minor:
    return "a cause, not a major one"
  if cause:
    return "a cause"
  return "not a major cause" if minor else "inconclusive"


def planet_verdict(low: float, high: float, major: float = MAJOR) -> str:
  """The same rule for both changes together against PlaNet (SK minus P): worse if the
  upper end is below 0, closer than half the gap if the lower end is above ``-major``.

  >>> planet_verdict(-400.0, -20.0), planet_verdict(-100.0, 40.0), planet_verdict(-120.0, -5.0)
  ('worse than PlaNet', 'not worse than PlaNet by half the gap', 'worse than PlaNet, by less than half the gap')
  """
  worse, close = high < 0, low > -major
  if worse and close:
    return "worse than PlaNet, by less than half the gap"
  if worse:
    return "worse than PlaNet"
  return "not worse than PlaNet by half the gap" if close else "inconclusive"


def response(record: Mapping) -> float:
  """A run's response: its mean held-out return under ``RULE``."""
  return float(np.mean(record["eval_returns"][RULE]))


def _interval(values: Sequence[float]) -> dict[str, object]:
  values = [float(v) for v in values]
  if len(values) < 2:
    return {"estimate": values[0] if values else None, "low": None, "high": None,
            "values": values}
  return {**t_interval(values, LEVEL).as_dict(), "values": values}


def _complete_seeds(records: Mapping[str, Mapping[int, Mapping]], cells: Sequence[str]
                    ) -> list[int]:
  seeds = [set(records.get(cell, {})) for cell in cells]
  return sorted(set.intersection(*seeds)) if seeds else []


def effects(records: Mapping[str, Mapping[int, Mapping]]) -> dict[str, dict[str, object]]:
  """Each effect over the seeds that have all its cells: per-seed values, their mean with
  its interval, and the rule's verdict (``planet_verdict`` for SK minus P)."""
  out = {}
  for name, (weights, meaning) in EFFECTS.items():
    seeds = _complete_seeds(records, list(weights))
    values = [sum(w * response(records[cell][seed]) for cell, w in weights.items())
              for seed in seeds]
    entry = {"meaning": meaning, "seeds": seeds, **(_interval(values) if values else {})}
    if entry.get("low") is not None:
      judge = planet_verdict if name == "both_minus_planet" else factor_verdict
      entry["verdict"] = judge(entry["low"], entry["high"])
    else:
      entry["verdict"] = "too few seeds"
    out[name] = entry
  return out


def _mean_dict(dicts: Sequence[Mapping[str, float]]) -> dict[str, float]:
  return {key: float(np.mean([d[key] for d in dicts])) for key in dicts[0]} if dicts else {}


def cell_summary(runs: Mapping[int, Mapping]) -> dict[str, object]:
  """One cell over its seeds: the response, the final weight KL, the stddev ratios and the
  fit on the shared probe episodes (means over seeds)."""
  seeds = sorted(runs)
  return {
      "seeds": seeds,
      "return": _interval([response(runs[s]) for s in seeds]),
      "final_weight_kl": float(np.mean([runs[s]["final_weight_kl"] for s in seeds])),
      "final_stddev_ratio": _mean_dict([runs[s]["final_stddev_ratio"] for s in seeds]),
      "shared_fit": {kind: _mean_dict([runs[s]["shared_fit"][kind] for s in seeds])
                     for kind in ("mean", "sampled")},
  }


def fit_against_planet(records: Mapping[str, Mapping[int, Mapping]]
                       ) -> dict[str, dict[str, dict[str, object]]]:
  """Each Bayesian cell's fit on the shared probe episodes minus PlaNet's, paired by seed,
  per term, at the posterior mean and under weight samples."""
  out = {}
  for cell in records:
    if cell == "P":
      continue
    seeds = _complete_seeds(records, [cell, "P"])
    if not seeds:
      continue
    out[cell] = {
        f"{kind}/{term}": _interval([records[cell][s]["shared_fit"][kind][term]
                                     - records["P"][s]["shared_fit"]["mean"][term]
                                     for s in seeds])
        for kind in ("mean", "sampled") for term in FIT_TERMS}
  return out


# Outputs of a run that do not depend on the machine's speed.
REPRODUCED = ("eval_returns", "validation_returns", "open_loop_mse", "velocity_probe_r2",
              "final_weight_kl")


def identical_to_published(record: Mapping, published: Mapping) -> bool:
  """Whether a rerun reproduces a published run bit for bit: the same config, the same
  ``REPRODUCED`` outputs and the same curve entries (those the published run has)."""
  return (recorded_config(record) == recorded_config(published)
          and all(record[key] == published[key] for key in REPRODUCED)
          and all(record["curve"][key] == values
                  for key, values in published["curve"].items()))


def summarize(records: Mapping[str, Mapping[int, Mapping]],
              published: Mapping[str, Mapping[int, bool]] | None = None
              ) -> dict[str, object]:
  """The ablation's summary: cells, effects with verdicts, the fit against PlaNet, and
  which reruns of published runs reproduced them (``published``: cell -> seed -> bool)."""
  return {
      "rule": RULE, "level": LEVEL, "major": MAJOR,
      "cells": {cell: {"settings": CELLS[cell], **cell_summary(runs)}
                for cell, runs in records.items() if runs},
      "effects": effects(records),
      "fit_minus_planet": fit_against_planet(records),
      "published_identical": published or {},
  }
