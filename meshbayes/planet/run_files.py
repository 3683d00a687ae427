"""One trained run per file: a rerun with the same settings reads it instead of training.

``OUT/runs/NAME_seedN.json`` holds ``training.train``'s record (strict JSON: a diverged
run's non-finite figures as nulls with their reason); a record whose ``config`` differs
from the one asked for is trained again, so an interrupted command resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

from meshbayes.planet.agent import Agent
from meshbayes.planet.config import PlanetConfig
from meshbayes.planet.training import train
from meshbayes.runtime import strict_json


def run_path(out: str, name: str, seed: int) -> str:
  """Where the run ``name`` (an estimator or an ablation cell) of ``seed`` is kept."""
  return os.path.join(out, "runs", f"{name}_seed{seed}.json")


def read_run(path: str) -> dict[str, object] | None:
  """The record at ``path``, or None where there is none."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return strict_json.restore(json.load(f))  # a diverged run's NaN figures as trained


def recorded_config(record: dict[str, object]) -> dict[str, object]:
  """The settings a record was trained with, every ``PlanetConfig`` field present: a field
  added after the record was written takes its default, which keeps the behaviour the
  record was made with."""
  defaults = {field.name: field.default for field in dataclasses.fields(PlanetConfig)}
  return {**defaults, **record["config"]}


def trained(config: PlanetConfig, agent: Agent, path: str,
            log: Callable[[str], None] | None = None) -> dict[str, object]:
  """The record of ``config``'s run: read from ``path`` if it holds this config's, else
  trained with ``agent`` and written there (atomically: a cut-short write leaves none)."""
  record = read_run(path)
  if record is not None and recorded_config(record) == dataclasses.asdict(config):
    return record
  record = train(config, agent, log=log)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    f.write(strict_json.dumps(record, null_reasons=strict_json.NULL_REASONS))
  os.replace(path + ".tmp", path)
  return record
