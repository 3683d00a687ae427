"""One check of the project on an accelerator: the train step's speed against the frozen
models, then train, resume, eval and infer as commands.

``step_section`` times the trainer's jitted train step (one device, ``data_only``
rules) of a ``StepPreset``, deterministic and Bayesian (both AdamW), bf16, round-robin
(``timing.alternate``): seconds, traced matmul FLOPs, TFLOP/s and MFU
(``scaling.peaks``), the peak memory in use, and beside each measured step both
frozen step-time models' predictions from the program that ran
(``roofline.FROZEN_GPU_MODEL``, v1, under ``predicted``; ``FROZEN_GPU_MODEL_V2`` under
``predicted_v2``: seconds, MFU, the measured step's error against each). Where
cuDNN is unavailable (not an NVIDIA GPU) a preset's ``attention_kernel='cudnn'``
runs as XLA's attention, recorded under ``replaced``. A step that fails (out of
memory) records its ``error`` and the others go on; ``merge`` joins the reports of
a preset's processes. ``PLANS`` order steps and attention alone
(``attention_alone``) for one run. ``run_section`` trains
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
# remat, cuDNN attention without attention dropout, more sequences per step (paper: 16 for
# the Bayesian step, 32 for the deterministic one, ``paper_gpu32``); not run by default
# (their compiles take minutes).
GPU_SHAPE = (("scan_layers", False), ("attention_dropout_rate", 0.0),
             ("attention_kernel", "cudnn"))
# The same with XLA's attention: the alternative the v2 model decides against or for.
GPU_SHAPE_XLA = GPU_SHAPE[:2] + (("attention_kernel", "xla"),)
STEP_PRESETS = {"base": StepPreset("base", 32, 256, "none"),
                "paper": StepPreset("paper", 8, 256, "full"),
                "paper_no_remat": StepPreset("paper", 8, 256, "none", separate=True),
                "base_gpu": StepPreset("base", 128, 256, "none", overrides=GPU_SHAPE),
                "paper_gpu": StepPreset("paper", 16, 256, "none", separate=True,
                                        overrides=GPU_SHAPE),
                "paper_gpu32": StepPreset("paper", 32, 256, "none", separate=True,
                                          overrides=GPU_SHAPE),
                "base_gpu_xla": StepPreset("base", 128, 256, "none", overrides=GPU_SHAPE_XLA)}
DEFAULT_PRESETS = ("base", "paper", "paper_no_remat")
TOY_PRESETS = {"tiny": StepPreset("tiny", 4, 16, "none"),
               "tiny_gpu": StepPreset("tiny", 4, 16, "none", overrides=GPU_SHAPE)}

# A plan: one run's items in order, each ("step", preset, kinds) or ("attention", shapes).
# ``v2`` confirms the v2 model: first one gpu.gin step with cuDNN's fused attention (base,
# deterministic: where v1 and v2 differ most), then attention alone at the presets' shapes,
# then the same step with XLA's attention (cuDNN against XLA for gpu.gin, measured), then
# the gpu.gin steps the issue's tables need, as time allows.
PLANS = {"v2": (("step", "base_gpu", ("deterministic",)),
                ("attention", ("paper", "base", "base_gpu", "paper_gpu")),
                ("step", "base_gpu_xla", ("deterministic",)),
                ("step", "base_gpu", ("bayesian",)),
                ("step", "paper_gpu32", ("deterministic",)),
                ("step", "paper_gpu", ("bayesian",)))}
# The same items at toy size, on any platform (XLA's attention where cuDNN is unavailable).
TOY_PLANS = {"v2": (("step", "tiny_gpu", ("deterministic",)), ("attention", ("tiny",)),
                    ("step", "tiny_gpu", ("bayesian",)))}
INPUTS = "5 6 7 8\n9 10 11\n2 3\n"


def frozen_prediction(hlo_text: str, device_kind: str, batch_size: int, length: int,
                      model_flops: float, model: Any = None) -> dict[str, Any]:
  """A frozen GPU model's (default v1) step seconds and MFU for a compiled program, or why
  there are none."""
  from meshbayes.scaling import fused_attention, peaks, roofline

  model = model or roofline.FROZEN_GPU_MODEL
  generation = peaks.ROOFLINE_GENERATIONS.get(device_kind)
  if generation not in roofline.GPU_GENERATIONS:
    return {"error": f"n/a: the frozen model is for {', '.join(roofline.GPU_GENERATIONS)}, "
                     f"not {device_kind!r}"}
  try:
    record = fused_attention.program_record(hlo_text, generation, batch_size=batch_size,
                                            input_length=length, target_length=length,
                                            model_flops_per_device=model_flops)
    prediction = roofline.predict(record, gpu_model=model)
  except ValueError as error:  # a program the model cannot read: the measured step stays
    return {"error": f"n/a: {error}"}
  return {"seconds": prediction.step_seconds, "mfu": prediction.mfu,
          "matmul_seconds": prediction.compute_seconds,
          "memory_seconds": prediction.memory_seconds,
          "kernel_seconds": prediction.kernel_seconds,
          "attention_seconds": prediction.attention_seconds,
          "fused_attention_calls": sum(c["executed"]
                                       for c in record["fused_attention_per_device"]),
          "kernels": sum(op["executed"] for op in record["operations_per_device"].values())}


def runnable_overrides(overrides: Sequence[tuple[str, Any]], platform: str
                       ) -> tuple[tuple[tuple[str, Any], ...], str | None]:
  """``overrides`` as they can run on ``platform``: cuDNN's fused attention needs an NVIDIA
  GPU, so elsewhere XLA's attention takes its place; and what was replaced (None: nothing)."""
  if platform == "gpu" or ("attention_kernel", "cudnn") not in overrides:
    return tuple(overrides), None
  return (tuple((k, "xla" if k == "attention_kernel" else v) for k, v in overrides),
          f"attention_kernel='cudnn' ran as 'xla': no cuDNN on {platform}")


def step_section(step: StepPreset, kinds: Sequence[str], rounds: int) -> dict[str, Any]:
  """Train steps of one preset, timed together, with MFU and both frozen models' predictions."""
  # JAX starts here, not on import: the tool's parent process never holds the GPU.
  import jax
  import numpy as np

  from meshbayes.scaling import hlo, peaks
  from meshbayes.scaling.roofline import FROZEN_GPU_MODEL_V2
  from meshbayes.scaling.step_spec import (compiled_train_step, one_device_partitioner,
                                           random_batch, step_spec, traced_step_flops)
  from meshbayes.scaling.timing import alternate

  device = jax.devices()[0]
  partitioner = one_device_partitioner()
  rng = np.random.default_rng(0)
  overrides, replaced = runnable_overrides(step.overrides, device.platform)
  programs, flops, states, errors, predicted, predicted_v2 = {}, {}, {}, {}, {}, {}
  for kind in kinds:
    spec = step_spec(step.preset, step.batch_size, step.length, kind == "deterministic",
                     dtype="bfloat16", remat_policy=step.remat, overrides=overrides)
    batch = random_batch(spec, rng)
    try:
      start = time.perf_counter()
      states[kind], compiled = compiled_train_step(spec, partitioner, batch)
      compile_seconds = time.perf_counter() - start
      text = compiled.as_text()
      traced = traced_step_flops(spec, partitioner, batch)
      flops[kind] = {"traced_matmul": traced, "hlo_matmul": hlo.analyze(text).matmul_flops,
                     "compile_seconds": compile_seconds}
      predicted[kind], predicted_v2[kind] = (
          frozen_prediction(text, device.device_kind, step.batch_size, step.length, traced,
                            model) for model in (None, FROZEN_GPU_MODEL_V2))
    except Exception as error:  # an out-of-memory compile: recorded, the others still run
      errors[kind] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
      continue

    def run(name=kind, fn=compiled, data=batch):
      states[name], metrics = fn(states[name], data)  # the old state is donated
      return metrics["loss"]

    programs[kind] = run
  report: dict[str, Any] = {**dataclasses.asdict(step), "dtype": "bfloat16", "flops": flops,
                            "predicted": predicted, "predicted_v2": predicted_v2,
                            "errors": errors, **({"replaced": replaced} if replaced else {})}
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
    for by_model in (predicted, predicted_v2):
      if "seconds" in by_model.get(kind, {}):
        by_model[kind]["measured_error"] = seconds / by_model[kind]["seconds"] - 1
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


def summary(steps: dict[str, dict[str, Any]], attention: dict[str, Any] | None = None) -> str:
  """Markdown tables: each measured step beside both frozen models' predictions (v1, v2),
  and each attention measured alone beside v2's charge."""
  fmt = lambda value, spec: "-" if not isinstance(value, (int, float)) else format(value, spec)
  lines = ["| preset | kind | measured s | v1 s | measured / v1 - 1 | v2 s | measured / v2 - 1 "
           "| MFU measured | MFU v1 | MFU v2 | peak GiB |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for name, report in steps.items():
    for kind in KINDS:
      if kind not in report.get("predicted", {}) and kind not in report.get("errors", {}):
        continue  # not run in this process (a plan runs the kinds apart)
      seconds = report.get("seconds", {}).get(kind)
      v1 = report.get("predicted", {}).get(kind, {})
      v2 = report.get("predicted_v2", {}).get(kind, {})
      mfu = report.get("mfu")
      error = report.get("errors", {}).get(kind)
      peak = (report.get("peak_bytes_in_use") or {}).get(kind)  # None on CPUs
      lines.append(
          f"| {name} | {kind} | {fmt(seconds, '.4f') if not error else 'error'} "
          f"| {fmt(v1.get('seconds'), '.4f')} | {fmt(v1.get('measured_error'), '+.1%')} "
          f"| {fmt(v2.get('seconds'), '.4f')} | {fmt(v2.get('measured_error'), '+.1%')} "
          f"| {fmt(mfu.get(kind) if isinstance(mfu, dict) else None, '.1%')} "
          f"| {fmt(v1.get('mfu'), '.1%')} | {fmt(v2.get('mfu'), '.1%')} "
          f"| {fmt(peak / 2**30 if peak else None, '.1f')} |")
  text = "\n".join(lines) + "\n"
  if attention and attention.get("shapes"):
    lines = ["", "| attention alone | implementation | measured ms | TFLOP/s | v2 ms "
             "| measured / v2 - 1 |", "|---|---|---:|---:|---:|---:|"]
    for name, entry in attention["shapes"].items():
      v2 = entry.get("v2_seconds")
      lines.append(
          f"| {name} ({entry['batch']} x {entry['length']}, {entry['heads']} heads of "
          f"{entry['head_width']}) | {entry['implementation']} "
          f"| {fmt(entry['seconds'] * 1e3, '.3f')} "
          f"| {fmt(entry['flops_per_second'] / 1e12, '.1f')} "
          f"| {fmt(v2 * 1e3 if isinstance(v2, float) else None, '.3f')} "
          f"| {fmt(entry.get('measured_over_v2'), '+.1%')} |")
    text += "\n".join(lines) + "\n"
  return text


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

