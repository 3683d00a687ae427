"""What an evaluation writes: ``metrics.json``, the reliability diagrams, TensorBoard
scalars and their JSON lines (the per-source items are ``items.write_items``')."""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from etils import epath

from meshbayes import metrics
from meshbayes.runtime.metrics_writer import MetricsWriter


def scalars(tree: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """The numbers of a nested result as ``{'a/b': value}`` (TensorBoard tags)."""
  found = {}
  for name, value in tree.items():
    if isinstance(value, Mapping):
      found.update(scalars(value, f"{prefix}{name}/"))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
      found[f"{prefix}{name}"] = float(value)
  return found


def jsonable(tree: Any) -> Any:
  """Per-bin arrays as lists, empty bins (NaN) as null."""
  if isinstance(tree, dict):
    return {k: jsonable(v) for k, v in tree.items()}
  if isinstance(tree, np.ndarray):
    return [float(x) if np.isfinite(x) else None for x in tree.ravel()]
  return tree


def write_results(out_dir: epath.Path, result: dict[str, Any],
                  reliability: dict[str, dict[str, Any]], run_name: str) -> None:
  """``metrics.json``, ``reliability.json`` and ``reliability.png`` (process 0 only: every
  process holds the same results), and the scalars tagged ``<split>/<name>`` at the
  evaluated step (``metrics.jsonl`` and TensorBoard)."""
  split, step = result["split"], result["step"]
  if jax.process_index() == 0:
    (out_dir / "reliability.json").write_text(json.dumps(jsonable(reliability)))
    with (out_dir / "reliability.png").open("wb") as png:
      metrics.plot_token_and_sequence_reliability(
          {f"{run_name} ({name})": curves for name, curves in reliability.items()},
          png, title=f"{result['task']}/{split}, step {step}")
    (out_dir / "metrics.json").write_text(json.dumps(jsonable(result), indent=2))
    print(f"evaluated step {step} on {result['task']}/{split}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float)))
    print(f"results in {out_dir} (metrics.json: every figure and its interval)", flush=True)
  writer = MetricsWriter(out_dir, out_dir / "metrics.jsonl")
  writer.write(step, {f"{split}/{name}": value for name, value in scalars(result).items()
                      if name not in ("step", "num_samples")
                      and not name.startswith(("intervals/", "ood_intervals/"))})
  writer.close()
