"""What an evaluation writes: one set of outputs (each predictive's items, the OOD scores,
``metrics.json``, the reliability diagrams) under its manifest (``evaluation.manifest``),
and the scalars appended to the history (``metrics.jsonl`` and TensorBoard)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from etils import epath

from meshbayes import metrics
from meshbayes.evaluation import items, manifest
from meshbayes.metrics import measures as registry
from meshbayes.runtime import strict_json
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


def null_reason(result: Mapping[str, Any]) -> strict_json.Explain:
  """Why a figure of ``result`` is null: for a calibration AUROC of one class only, which
  (its count of positives); else ``strict_json``'s reason."""

  def explain(path: str, value: float) -> str:
    parts = path.split("/")
    if math.isnan(value) and len(parts) >= 3 and parts[0] in ("decoding", "intervals") and \
        parts[2].endswith("calibration_auroc"):
      figures = result.get("intervals", {}).get(parts[1], {})
      count = registry.positives_figure(parts[2])
      positives = figures.get(count, {}).get("estimate")
      total = figures.get("num_items", {}).get("estimate")
      if positives is not None and positives in (0, total):
        return (f"nan: one class only ({count} {positives:.0f} of {total:.0f} outputs): the "
                "AUROC needs outputs that match a reference and outputs that do not")
    return strict_json.NAN_REASON if math.isnan(value) else f"{value}: not a finite number"

  return explain


def write_results(out_dir: epath.Path, result: dict[str, Any],
                  reliability: dict[str, dict[str, Any]], run_name: str,
                  source_items: Mapping[str, items.SourceItems],
                  ood_scores: items.OodScores | None, settings: Mapping[str, Any]) -> None:
  """The evaluation's set of outputs (process 0 only: every process holds the same
  results), replacing the previous set whole: each predictive's items, ``ood_scores.npz``,
  ``reliability.json`` and ``.png``, ``metrics.json`` (strict JSON, each null's reason under
  ``null_reasons``), then their manifest (``settings``' fingerprint in it); and the
  scalars tagged ``<split>/<name>`` at the evaluated step appended to ``metrics.jsonl``
  and TensorBoard."""
  split, step = result["split"], result["step"]
  if jax.process_index() == 0:
    manifest.begin(out_dir)
    written = [name for predictive, predictive_items in source_items.items()
               for name in items.write_items(predictive_items, out_dir, predictive)]
    if ood_scores is not None:
      written.append(items.write_ood_scores(ood_scores, out_dir))
    (out_dir / "reliability.json").write_text(strict_json.dumps(jsonable(reliability)))
    with (out_dir / "reliability.png").open("wb") as png:
      metrics.plot_token_and_sequence_reliability(
          {f"{run_name} ({name})": curves for name, curves in reliability.items()},
          png, title=f"{result['task']}/{split}, step {step}")
    (out_dir / "metrics.json").write_text(strict_json.dumps(
        jsonable(result), null_reasons=strict_json.NULL_REASONS, explain=null_reason(result), indent=2))
    written += ["reliability.json", "reliability.png", "metrics.json"]
    manifest.finish(out_dir, written, step=step, method=result["method"], task=result["task"],
                    split=split, settings=settings)
    print(f"evaluated step {step} on {result['task']}/{split}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float)))
    print(f"results in {out_dir} (metrics.json: every figure and its interval)", flush=True)
  writer = MetricsWriter(out_dir, out_dir / "metrics.jsonl")
  writer.write(step, {f"{split}/{name}": value for name, value in scalars(result).items()
                      if name not in ("step", "num_samples")
                      and not name.startswith(("intervals/", "ood_intervals/"))})
  writer.close()
