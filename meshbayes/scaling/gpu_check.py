"""One check of the project on an accelerator: the train step's speed against the frozen
model, then train, resume, eval and infer as commands.

``step_section`` times the trainer's jitted train step (one device, ``data_only``
rules) of a ``StepPreset``, deterministic and Bayesian (both AdamW), bf16, round-robin
(``timing.alternate``): seconds, traced matmul FLOPs, TFLOP/s and MFU
(``scaling.peaks``), the peak memory in use, and beside each measured step the
frozen step-time model's prediction from the program that ran
(``roofline.FROZEN_GPU_MODEL``: seconds, MFU, the measured step's error against
it). A step that fails (out of memory) records its ``error`` and the others go
on; ``merge`` joins the reports of a preset's processes. ``run_section`` trains
``gin_configs/examples/tiny_synthetic_bayesian.gin`` to a checkpoint, resumes
it, evaluates and infers the run, each as its command (``python -m meshbayes.train``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshbayes.runtime import strict_json

EXAMPLE = "gin_configs/examples/tiny_synthetic_bayesian.gin"
KINDS = ("deterministic", "bayesian")


@dataclasses.dataclass(frozen=True)
class StepPreset:
  """A train step to time: preset, batch, length, remat policy, other ``TransformerConfig``
  overrides, and whether its deterministic and Bayesian steps need a process each (they
  do not fit together)."""

  preset: str
  batch_size: int
  length: int
  remat: str
  separate: bool = False
  overrides: tuple[tuple[str, Any], ...] = ()


# base and paper: the shared H200 measurement's settings; paper without remat: what memory
# now allows (the Bayesian step needs about 123 GB). The ``_gpu`` presets: the step's shape
# the frozen model chose for an H200 (gin_configs/hardware/gpu.gin): layers unrolled, no
# remat, cuDNN attention without attention dropout, more sequences per step; not run by
# default (their compiles take minutes).
GPU_SHAPE = (("scan_layers", False), ("attention_dropout_rate", 0.0),
             ("attention_kernel", "cudnn"))
STEP_PRESETS = {"base": StepPreset("base", 32, 256, "none"),
                "paper": StepPreset("paper", 8, 256, "full"),
                "paper_no_remat": StepPreset("paper", 8, 256, "none", separate=True),
                "base_gpu": StepPreset("base", 128, 256, "none", overrides=GPU_SHAPE),
                "paper_gpu": StepPreset("paper", 16, 256, "none", separate=True,
                                        overrides=GPU_SHAPE)}
DEFAULT_PRESETS = ("base", "paper", "paper_no_remat")
TOY_PRESETS = {"tiny": StepPreset("tiny", 4, 16, "none")}
INPUTS = "5 6 7 8\n9 10 11\n2 3\n"


def frozen_prediction(hlo_text: str, device_kind: str, batch_size: int, length: int,
                      model_flops: float) -> dict[str, Any]:
  """The frozen GPU model's step seconds and MFU for a compiled program, or why there are none."""
  from meshbayes.scaling import hlo_profile, peaks, roofline

  generation = peaks.ROOFLINE_GENERATIONS.get(device_kind)
  if generation not in roofline.GPU_GENERATIONS:
    return {"error": f"n/a: the frozen model is for {', '.join(roofline.GPU_GENERATIONS)}, "
                     f"not {device_kind!r}"}
  record = hlo_profile.program_record(hlo_text, generation, batch_size=batch_size,
                                      input_length=length, target_length=length,
                                      model_flops_per_device=model_flops)
  prediction = roofline.predict(record)
  return {"seconds": prediction.step_seconds, "mfu": prediction.mfu,
          "matmul_seconds": prediction.compute_seconds,
          "memory_seconds": prediction.memory_seconds,
          "kernel_seconds": prediction.kernel_seconds,
          "kernels": sum(op["executed"] for op in record["operations_per_device"].values())}


def step_section(step: StepPreset, kinds: Sequence[str], rounds: int) -> dict[str, Any]:
  """Train steps of one preset, timed together, with MFU and the frozen model's prediction."""
  # JAX starts here, not on import: the tool's parent process never holds the GPU.
  import jax
  import numpy as np

  from meshbayes.scaling import hlo, peaks
  from meshbayes.scaling.step_spec import (compiled_train_step, one_device_partitioner,
                                           random_batch, step_spec, traced_step_flops)
  from meshbayes.scaling.timing import alternate

  device = jax.devices()[0]
  partitioner = one_device_partitioner()
  rng = np.random.default_rng(0)
  programs, flops, states, errors, predicted = {}, {}, {}, {}, {}
  for kind in kinds:
    spec = step_spec(step.preset, step.batch_size, step.length, kind == "deterministic",
                     dtype="bfloat16", remat_policy=step.remat, overrides=step.overrides)
    batch = random_batch(spec, rng)
    try:
      start = time.perf_counter()
      states[kind], compiled = compiled_train_step(spec, partitioner, batch)
      compile_seconds = time.perf_counter() - start
      text = compiled.as_text()
      traced = traced_step_flops(spec, partitioner, batch)
      flops[kind] = {"traced_matmul": traced, "hlo_matmul": hlo.analyze(text).matmul_flops,
                     "compile_seconds": compile_seconds}
      predicted[kind] = frozen_prediction(text, device.device_kind, step.batch_size,
                                          step.length, traced)
    except Exception as error:  # an out-of-memory compile: recorded, the others still run
      errors[kind] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
      continue

    def run(name=kind, fn=compiled, data=batch):
      states[name], metrics = fn(states[name], data)  # the old state is donated
      return metrics["loss"]

    programs[kind] = run
  report: dict[str, Any] = {**dataclasses.asdict(step), "dtype": "bfloat16", "flops": flops,
                            "predicted": predicted, "errors": errors}
  try:
    times, medians = alternate(programs, rounds, warmup=1) if programs else ({}, {})
  except Exception as error:  # out of memory at run time
    errors["run"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return report
  stats = device.memory_stats() or {}
  report.update({"seconds": times, "median_seconds": medians,
                 # The process's peak, under each kind it ran.
                 "peak_bytes_in_use": {kind: stats.get("peak_bytes_in_use") for kind in times},
                 "bytes_limit": stats.get("bytes_limit"),
                 **peaks.utilization({k: f["traced_matmul"] for k, f in flops.items()}, times,
                                     device.device_kind, device.platform)})
  for kind, seconds in times.items():
    if "seconds" in predicted.get(kind, {}):
      predicted[kind]["measured_error"] = seconds / predicted[kind]["seconds"] - 1
  return report



def merge(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """One preset's report from the reports of its processes (one, or one per kind)."""
  merged: dict[str, Any] = {}
  for part in parts:
    for key, value in part.items():
      if isinstance(value, dict) and isinstance(merged.get(key), dict):
        merged[key] = {**merged[key], **value}
      else:
        merged.setdefault(key, value)
  times, flops = merged.get("seconds", {}), merged.get("flops", {})
  if set(KINDS) <= set(times):
    merged["time_ratio"] = times["bayesian"] / times["deterministic"]
    merged["efficiency_quotient"] = merged["time_ratio"] / (
        flops["bayesian"]["traced_matmul"] / flops["deterministic"]["traced_matmul"])
  return merged



def report_text(report: dict[str, Any]) -> str:
  """The report as strict JSON: a non-finite figure null, its reason under ``null_reasons``
  (a step section's own, written by its process, stay in that section)."""
  return strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=2) + "\n"


def summary(steps: dict[str, dict[str, Any]]) -> str:
  """A markdown table: each measured step beside the frozen model's prediction."""
  lines = ["| preset | kind | measured s | predicted s | measured / predicted - 1 | "
           "MFU measured | MFU predicted | peak GiB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
  for name, report in steps.items():
    for kind in KINDS:
      seconds = report.get("seconds", {}).get(kind)
      predicted = report.get("predicted", {}).get(kind, {})
      mfu = report.get("mfu")
      fmt = lambda value, spec: "-" if value is None else format(value, spec)
      error = report.get("errors", {}).get(kind)
      peak = (report.get("peak_bytes_in_use") or {}).get(kind)  # None on CPUs
      lines.append(
          f"| {name} | {kind} | {fmt(seconds, '.4f') if not error else 'error'} "
          f"| {fmt(predicted.get('seconds'), '.4f')} "
          f"| {fmt(predicted.get('measured_error'), '+.1%')} "
          f"| {fmt(mfu.get(kind) if isinstance(mfu, dict) else None, '.1%')} "
          f"| {fmt(predicted.get('mfu'), '.1%')} "
          f"| {fmt(peak / 2**30 if peak else None, '.1f')} |")
  return "\n".join(lines) + "\n"


def run_command(args: list[str], timeout: float, env: dict[str, str] | None = None
             ) -> dict[str, Any]:
  start = time.perf_counter()
  try:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    code, err = done.returncode, done.stderr
  except subprocess.TimeoutExpired as expired:
    code, err = None, f"timed out after {timeout} s: {expired.stderr or ''}"
  return {"exit_code": code, "seconds": time.perf_counter() - start,
          "stderr_tail": str(err)[-1500:] if code != 0 else ""}


def _checkpoint_steps(model_dir: Path) -> list[int]:
  folder = model_dir / "checkpoints"
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) \
      if folder.is_dir() else []


def run_section(work: Path, steps: int, batch_size: int, timeout: float) -> dict[str, Any]:
  """Train to ``steps // 2`` (checkpoint), resume to ``steps``, then eval and infer the run."""
  model_dir = work / "run"
  train = [sys.executable, "-m", "meshbayes.train", f"--gin_file={EXAMPLE}",
           f"--gin.MODEL_DIR='{model_dir}'", f"--gin.BATCH_SIZE={batch_size}",
           f"--gin.run_configs.CheckpointConfig.period={steps // 2}", "--gin.train.log_period=5",
           "--gin.models.EncoderDecoderModel.num_train_units=450000"]
  report: dict[str, Any] = {"model_dir": str(model_dir)}
  first = run_command(train + [f"--gin.TRAIN_STEPS={steps // 2}"], timeout)
  first["checkpoint_steps"] = _checkpoint_steps(model_dir)
  resumed = run_command(train + [f"--gin.TRAIN_STEPS={steps}"], timeout)
  resumed["checkpoint_steps"] = _checkpoint_steps(model_dir)
  report["train"] = {"first": first, "resumed": resumed,
                     "ok": first["exit_code"] == 0 and resumed["exit_code"] == 0
                     and first["checkpoint_steps"][-1:] == [steps // 2]
                     and resumed["checkpoint_steps"][-1:] == [steps]}
  eval_dir = work / "eval"
  evaluated = run_command([sys.executable, "-m", "meshbayes.eval", "--gin_file=runs/eval.gin",
                        "--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{model_dir}'",
                        f"--gin.BATCH_SIZE={batch_size}", "--gin.data.TaskData.max_eval_batches=1",
                        "--gin.evaluation.DecodeConfig.enabled=False",
                        f"--gin.evaluation.ReportConfig.output_dir='{eval_dir}'"],
                       timeout)
  metrics = eval_dir / "metrics.json"
  evaluated["metrics"] = json.loads(metrics.read_text()) if metrics.is_file() else None
  evaluated["ok"] = evaluated["exit_code"] == 0 and evaluated["metrics"] is not None
  report["eval"] = evaluated
  inputs, outputs = work / "inputs.txt", work / "outputs.txt"
  inputs.write_text(INPUTS)
  inferred = run_command([sys.executable, "-m", "meshbayes.infer", "--gin_file=runs/infer.gin",
                       "--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{model_dir}'",
                       f"--gin.BATCH_SIZE={batch_size}", f"--gin.INPUT_FILE='{inputs}'",
                       f"--gin.OUTPUT_FILE='{outputs}'"], timeout)
  inferred["outputs"] = outputs.read_text().splitlines() if outputs.is_file() else None
  inferred["ok"] = inferred["exit_code"] == 0 and inferred["outputs"] is not None \
      and len(inferred["outputs"]) == len(INPUTS.splitlines())
  report["infer"] = inferred
  return report

