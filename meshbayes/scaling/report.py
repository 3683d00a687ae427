"""Scaling-study records as a markdown table and log-log plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshbayes.scaling import roofline
from meshbayes.scaling.hlo import COLLECTIVES

GIB = float(1 << 30)
_SHORT = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A",
          "collective-permute": "CP"}


def bytes_needed(record: dict[str, Any]) -> float | None:
  """Per-device bytes a record needed: its peak, or what the compiler said when it ran out."""
  if record.get("peak_bytes_per_device") is not None:
    return float(record["peak_bytes_per_device"])
  if record.get("required_bytes_per_device") is not None:
    return float(record["required_bytes_per_device"])
  return None


def _gib(value: float | None) -> str:
  return "-" if value is None else f"{value / GIB:.2f}"


def _count(value: float | None) -> str:
  if value is None:
    return "-"
  for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if value >= size:
      return f"{value / size:.2f}{unit}"
  return f"{value:.0f}"


def _fits(record: dict[str, Any]) -> str:
  if record.get("error"):
    return "error"
  if record.get("fits") is None:
    return "-"
  verdict = "yes" if record["fits"] else "**no**"
  return verdict + (" (est.)" if record.get("fit_source") == "estimate" else "")


def _collectives(record: dict[str, Any]) -> str:
  census = record.get("collectives")
  if not census:
    return "-"
  parts = []
  for kind in COLLECTIVES:
    entry = census.get(kind, {})
    if entry.get("count"):
      parts.append(f"{_SHORT[kind]} {entry['count']}/{entry['executed']:.0f} "
                   f"{entry['executed_bytes'] / GIB:.2f}G")
  return ", ".join(parts) or "none"


def _model(record: dict[str, Any]) -> str:
  layers = f"{record['num_encoder_layers']}+{record['num_decoder_layers']}"
  kind = "det." if record["estimators"] == "deterministic" else "Bayes"
  if record.get("estimator_overrides"):
    kind += " (" + ", ".join(f"{k}={v}" for k, v in record["estimator_overrides"].items()) + ")"
  return (f"{record['model']} {kind} "
          f"d={record['emb_dim']} h={record['num_heads']}x{record['head_dim']} L={layers} "
          f"ff={record['mlp_dim']}")


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
  """One row per record: target, shapes, memory per device, fit, FLOPs, collectives, compile time.

  Memory is GiB per device; FLOPs are matmul FLOPs per device per step;
  collectives are ``kind count/executed-per-step bytes-per-step``.
  """
  header = ("| target | cores | mesh (data x model) | model | variational params | batch x len "
            "| optimizer, remat | args GiB | temp GiB | peak GiB | fits | TFLOPs/device/step "
            "| collectives (count/per step, GiB per step) | compile s |")
  lines = [header, "|" + "|".join(["---"] * (header.count("|") - 1)) + "|"]
  for r in records:
    mesh = r.get("mesh") or {}
    mesh_text = f"{mesh.get('data', '-')} x {mesh.get('model', '-')}"
    peak = r.get("peak_bytes_per_device")
    if peak is None and r.get("required_bytes_per_device"):
      peak_text = f">{_gib(r['required_bytes_per_device'])}"
    else:
      peak_text = _gib(peak)
    flops = r.get("flops_per_device")
    lines.append(
        f"| {r['target']} | {r['cores']} | {mesh_text} | {_model(r)} "
        f"| {_count(r.get('variational_params'))} "
        f"| {r['batch_size']} x {r['input_length']}/{r['target_length']} "
        f"| {r['optimizer']}, {r['remat_policy']} "
        f"| {_gib(r.get('argument_bytes_per_device'))} | {_gib(r.get('temp_bytes_per_device'))} "
        f"| {peak_text} | {_fits(r)} | {'-' if flops is None else f'{flops / 1e12:.3f}'} "
        f"| {_collectives(r)} | {r.get('compile_seconds', 0):.0f} |")
  notes = [r for r in records if r.get("message") or r.get("error")]
  if notes:
    lines.append("")
  for r in notes:
    lines.append(f"- {r['target']} ({_model(r)}): {r.get('message') or r.get('error')}")
  return "\n".join(lines) + "\n"


def _ms(seconds: float | None) -> str:
  if seconds is None:
    return "-"
  ms = seconds * 1e3
  return f"{ms:.0f}" if ms >= 10 or ms == 0 else f"{ms:.2g}"


def roofline_table(records: Sequence[dict[str, Any]]) -> str:
  """Predicted step time per compiled record (``meshbayes.scaling.roofline``) on its generation.

  Times are milliseconds per step; each step, throughput and MFU column gives
  collectives hidden behind computation / not hidden (``overlap`` max / sum).
  On GPUs the frozen step-time model's matmuls, other work and kernels
  (``roofline.FROZEN_GPU_MODEL``). Records that did not compile are left out.
  """
  header = ("| target | cores | model | batch x len | remat, dtype | compute ms | HBM ms "
            "| kernels ms | comm ms (by mesh axis) | step ms | tokens/s | TFLOP/s (slice) | MFU |")
  lines = [header, "|" + "|".join(["---"] * (header.count("|") - 1)) + "|"]
  fallback = False
  for r in records:
    if not r.get("flops_per_device") or r.get("generation") not in roofline.HARDWARE:
      continue
    hidden, exposed = (roofline.predict(r, overlap=o) for o in ("max", "sum"))
    axes = ", ".join(f"{axis} {_ms(seconds)}" for axis, seconds in
                     sorted(hidden.communication_by_axis.items(), key=lambda kv: -kv[1])
                     if seconds >= 0.01 * hidden.communication_seconds)  # the main ones
    comm = f"{_ms(hidden.communication_seconds)}" + (f" ({axes})" if axes else "")
    if hidden.communication_model != "replica groups":
      comm, fallback = comm + " *", True
    lines.append(
        f"| {r['target']} | {r['cores']} | {_model(r)} "
        f"| {r['batch_size']} x {r['input_length']}/{r['target_length']} "
        f"| {r['remat_policy']}, {r.get('dtype', '-')} | {_ms(hidden.compute_seconds)} "
        f"| {_ms(hidden.memory_seconds)} | {_ms(hidden.kernel_seconds)} | {comm} "
        f"| {_ms(hidden.step_seconds)} / {_ms(exposed.step_seconds)} "
        f"| {hidden.tokens_per_second:,.0f} / {exposed.tokens_per_second:,.0f} "
        f"| {hidden.tflops_per_second:,.0f} / {exposed.tflops_per_second:,.0f} "
        f"| {hidden.mfu:.0%} / {exposed.mfu:.0%} |")
  notes = []
  if fallback:
    notes.append("\\* " + roofline.FALLBACK_ASSUMPTION + " (the record has no replica groups; "
                 "recompile to get them).")
  if any(r.get("flops_per_device") and r.get("remat_policy") not in (None, "none")
         for r in records):
    notes.append("With rematerialization the records' model FLOPs count the recomputed "
                 "forward pass again: their MFU is the hardware FLOP utilization.")
  if notes:
    lines += [""] + notes
  return "\n".join(lines) + "\n"


def _save(figure: Any, path: str | Path) -> Path:
  import matplotlib.pyplot as plt
  figure.tight_layout()
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return path


def plot(records: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
  """Log-log plots of per-device memory and FLOPs against the number of cores.

  One line per model configuration (model, estimators, sizes); records that
  did not compile are left out. Returns the path, or None with nothing to plot.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  series: dict[str, list[dict[str, Any]]] = {}
  for r in records:
    if bytes_needed(r) is None:
      continue
    series.setdefault(_model(r) + f", {r['optimizer']}, remat {r['remat_policy']}", []).append(r)
  if not series:
    return None
  figure, (memory_axes, flops_axes) = plt.subplots(1, 2, figsize=(13, 5))
  for label, rows in series.items():
    rows = sorted(rows, key=lambda r: r["cores"])
    cores = [r["cores"] for r in rows]
    peak = [bytes_needed(r) / GIB for r in rows]
    line, = memory_axes.plot(cores, peak, "o-", label=f"{label}: peak")
    state = [r.get("state_bytes_per_device", 0) / GIB for r in rows]
    memory_axes.plot(cores, state, "s--", color=line.get_color(), alpha=0.6,
                     label=f"{label}: state (args)")
    # Compiled FLOPs where the step compiled; else the traced model's, split evenly.
    flop_rows = [r for r in rows if r.get("flops_per_device") or r.get("model_flops_per_device")]
    if flop_rows:
      flops = [r.get("flops_per_device") or r["model_flops_per_device"] for r in flop_rows]
      cores = [r["cores"] for r in flop_rows]
      flops_axes.plot(cores, flops, "-", color=line.get_color(), label=label)
      compiled = [(c, f) for c, f, r in zip(cores, flops, flop_rows) if r.get("flops_per_device")]
      traced = [(c, f) for c, f, r in zip(cores, flops, flop_rows)
                if not r.get("flops_per_device")]
      for points, fill in ((compiled, line.get_color()), (traced, "none")):
        if points:
          flops_axes.plot(*zip(*points), "o", color=line.get_color(), markerfacecolor=fill)
  limits = {r["generation"]: r["usable_hbm_bytes"] for r in records if r.get("usable_hbm_bytes")}
  for generation, limit in limits.items():
    memory_axes.axhline(limit / GIB, color="gray", linestyle=":")
    memory_axes.annotate(f"{generation} usable HBM", (1, limit / GIB),
                         xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8,
                         color="gray")
  for axes, ylabel in ((memory_axes, "GiB per device"),
                       (flops_axes, "matmul FLOPs per device per step")):
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("cores (devices)")
    axes.set_ylabel(ylabel)
    axes.grid(True, which="both", alpha=0.3)
  memory_axes.legend(fontsize=6)
  flops_axes.legend(fontsize=6, title="hollow: traced model FLOPs / cores (did not compile)",
                    title_fontsize=6)
  if title:
    figure.suptitle(title)
  return _save(figure, path)


def plot_search(records: Sequence[dict[str, Any]], path: str | Path, title: str = ""
                ) -> Path | None:
  """Per-device memory against model size for a search: one line per target and depth.

  Filled markers fit, hollow ones did not (their memory is what the compiler
  said they need). Returns the path, or None with nothing to plot.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  series: dict[str, list[dict[str, Any]]] = {}
  for r in records:
    if bytes_needed(r) is not None:
      label = f"{r['target']}, {r['num_encoder_layers']}+{r['num_decoder_layers']} layers"
      series.setdefault(label, []).append(r)
  if not series:
    return None
  figure, axes = plt.subplots(figsize=(7, 5))
  for label, rows in series.items():
    rows = sorted(rows, key=lambda r: r["variational_params"])
    params = [r["variational_params"] / 1e9 for r in rows]
    memory = [bytes_needed(r) / GIB for r in rows]
    line, = axes.plot(params, memory, "-", label=label)
    for x, y, r in zip(params, memory, rows):
      axes.plot(x, y, "o", color=line.get_color(),
                markerfacecolor=line.get_color() if r["fits"] else "none")
  for generation, limit in {r["generation"]: r["usable_hbm_bytes"] for r in records
                            if r.get("usable_hbm_bytes")}.items():
    axes.axhline(limit / GIB, color="gray", linestyle=":")
    axes.annotate(f"{generation} usable HBM", (1, limit / GIB),
                  xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8,
                  color="gray")
  axes.set_xlabel("variational parameters (billions)")
  axes.set_ylabel("peak GiB per device (hollow: needed, did not fit)")
  axes.grid(True, alpha=0.3)
  axes.legend(fontsize=8)
  if title:
    axes.set_title(title, fontsize=10)
  return _save(figure, path)
