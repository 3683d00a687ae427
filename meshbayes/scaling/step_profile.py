"""Where the train step's time goes, by kind of work: measured on this machine, or predicted.

``time_report`` compiles the trainer's step of a preset, deterministic and
Bayesian (both AdamW), splits each program's operations by kind
(``step_operations``) with their seconds in a profile, and times the programs
alternating (``timing.alternate``), with the Bayesian step's ablations
(``ablations.WORK_ABLATIONS``: noise drawn as constants, no KL, SGD in place of
AdamW) when asked. ``gpu_report`` compiles the step for a GPU target without one
and splits the frozen step-time model's seconds (``roofline.FROZEN_GPU_MODEL``)
by kind of work of its kernels (``hlo_profile.WORK_KINDS``), with each kind's
kernels and HBM bytes and the kernels of avoidable work (``scaling.kernels``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from meshbayes.scaling.ablations import WORK_ABLATIONS
from meshbayes.scaling.aot import StepSpec
from meshbayes.scaling.step_operations import KINDS, by_kind, operations, profile, top_operations
from meshbayes.scaling.step_spec import (compiled_train_step, one_device_partitioner,
                                         random_batch)
from meshbayes.scaling.timing import alternate


def gpu_report(spec: StepSpec, target: Any) -> dict[str, Any]:
  """``spec``'s step compiled for a GPU target: the frozen model's seconds by kind of work.

  Raises:
    RuntimeError: the step did not compile (the compiler's message).
  """
  from meshbayes.scaling import aot, roofline

  record = aot.compile_and_profile(spec, target)
  if record.get("error") or not record.get("roofline"):
    raise RuntimeError(f"--target={target.name}: the step did not compile: "
                     f"{record.get('error') or record.get('message')}")
  seconds = roofline.seconds_by_kind(record)
  operations = record["operations_per_device"]
  return {"step": record["roofline"]["max"], "fits": record["fits"],
          "peak_bytes": record["peak_bytes_per_device"],
          "by_kind": {kind: {"seconds": seconds[kind], **operations[kind]} for kind in seconds},
          "avoidable_kernels": record["avoidable_kernels"]}


def gpu_markdown(report: dict[str, Any]) -> str:
  """Frozen-model milliseconds, kernels and HBM GB by kind of work, side by side."""
  det, bay = report["deterministic"], report["bayesian"]
  lines = ["| kind of work | det. ms | det. kernels | det. GB | Bayes. ms | Bayes. kernels "
           "| Bayes. GB |", "|---|" + "---:|" * 6]
  row = lambda r: (f"{r['seconds'] * 1e3:.1f} | {r['executed']:,.0f} | "
                   f"{r['bytes'] / 1e9:.1f}")
  for kind in det["by_kind"]:
    lines.append(f"| {kind} | {row(det['by_kind'][kind])} | {row(bay['by_kind'][kind])} |")
  step = lambda r: f"{r['step']['step_seconds'] * 1e3:.1f} ms, MFU {r['step']['mfu']:.1%}"
  lines += [f"| step | {step(det)} | | | {step(bay)} | | |", "",
            "| avoidable work | det. kernels | det. GB | Bayes. kernels | Bayes. GB |",
            "|---|---:|---:|---:|---:|"]
  for kind in det["avoidable_kernels"]:
    if kind != "kernels":
      d, b = det["avoidable_kernels"][kind], bay["avoidable_kernels"][kind]
      lines.append(f"| {kind} | {d['executed']:,.0f} | {d['bytes'] / 1e9:.1f} "
                   f"| {b['executed']:,.0f} | {b['bytes'] / 1e9:.1f} |")
  return "\n".join(lines)


def build_step(spec: StepSpec) -> tuple[Callable[[], Any], str, dict[str, float]]:
  """A runnable step (fresh state, one fixed batch), its HLO text and XLA's cost analysis."""
  batch = random_batch(spec, np.random.default_rng(0))
  state, compiled = compiled_train_step(spec, one_device_partitioner(), batch)
  holder = [state]

  def run():
    holder[0], metrics = compiled(holder[0], batch)  # the old state is donated
    return metrics["loss"]

  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return run, compiled.as_text(), {k: float(cost.get(k, 0.0))
                                   for k in ("flops", "transcendentals", "bytes accessed")}


def time_report(spec: StepSpec, profile_steps: int, rounds: int, ablations: bool, top: int
                ) -> dict[str, Any]:
  """Work and profiled seconds by kind of ``spec``'s step, deterministic and Bayesian, and
  the step times (alternating ``rounds`` rounds), with the ablations' when asked."""
  report: dict[str, Any] = {}
  programs = {}
  for name, deterministic in (("deterministic", True), ("bayesian", False)):
    run, text, cost = build_step(spec.replace(deterministic=deterministic))
    ops = operations(text)
    seconds = profile(run, profile_steps)
    programs[name] = run
    report[name] = {"cost_analysis": cost, "by_kind": by_kind(ops, seconds),
                    "profiled_seconds": sum(seconds.values()),
                    "top": top_operations(ops, seconds, top),
                    "operation_seconds": seconds}
  if ablations:
    for ablation, context in WORK_ABLATIONS.items():
      with context():
        programs[ablation] = build_step(spec.replace(
            deterministic=False, optimizer="sgd" if ablation == "sgd" else "adamw"))[0]
    programs["deterministic_sgd"] = build_step(spec.replace(deterministic=True,
                                                            optimizer="sgd"))[0]
  fastest, medians = alternate(programs, rounds)
  report["seconds"], report["median_seconds"] = fastest, medians
  return report


def markdown(report: dict[str, Any]) -> str:
  """The report's tables: work and profiled seconds by kind, then the programs' step times."""
  det, bay = report["deterministic"]["by_kind"], report["bayesian"]["by_kind"]
  lines = ["| kind | det. GFLOP | det. GB | det. s | Bayes. GFLOP | Bayes. GB | Bayes. s "
           "| excess s |", "|---|" + "---:|" * 7]
  for kind in (*KINDS, "matmul_async_wait"):
    d, b = det[kind], bay[kind]
    work = lambda row, key, scale: f"{row[key] / scale:.2f}" if key in row else "-"
    lines.append(f"| {kind} | {work(d, 'flops', 1e9)} | {work(d, 'bytes', 1e9)} | "
                 f"{d['seconds']:.3f} | {work(b, 'flops', 1e9)} | {work(b, 'bytes', 1e9)} | "
                 f"{b['seconds']:.3f} | {b['seconds'] - d['seconds']:+.3f} |")
  lines.append(f"| all profiled | | | {report['deterministic']['profiled_seconds']:.3f} | | | "
               f"{report['bayesian']['profiled_seconds']:.3f} | "
               f"{report['bayesian']['profiled_seconds'] - report['deterministic']['profiled_seconds']:+.3f} |")
  seconds = report["seconds"]
  lines += ["", "| program | step s (fastest) | median | / Bayesian |", "|---|---:|---:|---:|"]
  lines += [f"| {name} | {t:.3f} | {report['median_seconds'][name]:.3f} | "
            f"{t / seconds['bayesian']:.3f} |" for name, t in seconds.items()]
  return "\n".join(lines)
