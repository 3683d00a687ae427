"""One check of the project on an accelerator: step speed against the frozen model, then train,
resume, eval, infer.

Writes one JSON (``--out``) with four parts, each with its ``seconds``:

- ``step``: the trainer's jitted train step (``bench.compiled_train_step``, one
  device, ``data_only`` rules), deterministic and Bayesian (both AdamW), bf16,
  for the ``base`` preset (32 x 256 tokens, no remat), ``paper`` (8 x 256, full
  remat) and ``paper_no_remat`` (8 x 256: the Bayesian step, about 123 GB, and
  the deterministic one each in a process of their own). Each preset runs in a
  process of its own; its steps are timed round-robin (``bench.alternate``):
  seconds, traced matmul FLOPs, TFLOP/s and MFU (``scaling.peaks``), the peak
  memory in use, and beside each measured step the frozen step-time model's
  prediction from the program that ran (``roofline.FROZEN_GPU_MODEL``:
  seconds, MFU, the measured step's error against it). A step that fails (out
  of memory) records its ``error`` and the check goes on. ``--presets=base_gpu,
  paper_gpu`` times the step's shape chosen for GPUs instead (``hardware/gpu.gin``:
  layers unrolled, cuDNN attention, 128 and 16 sequences; their compiles take
  minutes), ``--kinds`` one kind only.
- ``train``: ``python -m meshbayes.train`` of
  ``gin_configs/examples/tiny_synthetic_bayesian.gin`` to step 25 (checkpoint),
  then again to 50 (a resume from that checkpoint); the checkpoint steps after each.
- ``eval``: ``python -m meshbayes.eval`` on the run (teacher-forced, one batch): its metrics.json.
- ``infer``: ``python -m meshbayes.infer`` on three lines of the synthetic task.

``ok`` is true when every part succeeded. At most 8 minutes on one H100 or H200
(mostly compiles; ``paper_no_remat``'s Bayesian step fits an H200 only).
``--toy`` runs the tiny preset at 4 x 16 tokens and 4 + 4 train steps, on a CPU
in a few minutes. On a lent GPU (docs/performance.md):

  PYTHONPATH=/tmp/site JAX_PLATFORMS=cuda python -m meshbayes.tools.gpu_check --out=gpu_check.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshbayes.runtime import strict_json
from meshbayes.scaling.targets import GPU_MEMORY_FRACTION

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
  import jax
  import jax.numpy as jnp
  import numpy as np

  from meshbayes.partitioning import Partitioner
  from meshbayes.scaling import hlo, peaks
  from meshbayes.scaling.aot import StepSpec
  from meshbayes.tools import bench

  device = jax.devices()[0]
  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=[device])
  rng = np.random.default_rng(0)
  programs, flops, states, errors, predicted = {}, {}, {}, {}, {}
  for kind in kinds:
    spec = StepSpec(model=step.preset, deterministic=kind == "deterministic", optimizer="adamw",
                    batch_size=step.batch_size, input_length=step.length,
                    target_length=step.length, model_parallel=1, partitioning="data_only",
                    num_train_units=1e6,
                    overrides=(("dtype", "bfloat16"), ("remat_policy", step.remat),
                               *step.overrides))
    shapes = spec.input_shapes()
    batch = {name: jnp.asarray(rng.integers(1, spec.config().vocab_size, size=shape), jnp.int32)
             for name, shape in shapes.items()}
    batch["decoder_loss_weights"] = jnp.ones(shapes["decoder_loss_weights"], jnp.int32)
    try:
      start = time.perf_counter()
      states[kind], compiled = bench.compiled_train_step(spec, partitioner, batch)
      compile_seconds = time.perf_counter() - start
      text = compiled.as_text()
      traced = bench.traced_step_flops(spec, partitioner, batch)
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
    times, medians = bench.alternate(programs, rounds, warmup=1) if programs else ({}, {})
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


def run_step_preset(name: str, step: StepPreset, args: argparse.Namespace, work: Path
                    ) -> dict[str, Any]:
  """A preset's step section in a process of its own (or one per kind), merged."""
  groups = [[kind] for kind in args.kinds] if step.separate else [list(args.kinds)]
  parts = []
  for kinds in groups:
    out = work / f"step-{name}-{'-'.join(kinds)}.json"
    command = [sys.executable, "-m", "meshbayes.tools.gpu_check", f"--out={out}",
               f"--step_only={name}", f"--kinds={','.join(kinds)}", f"--rounds={args.rounds}"]
    done = _command(command + (["--toy"] if args.toy else []), timeout=420,
                    # The share of memory the GPU targets' usable memory is stated against.
                    env={"XLA_PYTHON_CLIENT_MEM_FRACTION": str(GPU_MEMORY_FRACTION),
                         **os.environ})
    if out.is_file():
      parts.append(json.loads(out.read_text()))
    else:
      parts.append({"errors": {",".join(kinds): f"the process ended with {done['exit_code']}: "
                                                f"{done['stderr_tail'][-600:]}"}})
  return merge(parts)


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


def _command(args: list[str], timeout: float, env: dict[str, str] | None = None
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
  first = _command(train + [f"--gin.TRAIN_STEPS={steps // 2}"], timeout)
  first["checkpoint_steps"] = _checkpoint_steps(model_dir)
  resumed = _command(train + [f"--gin.TRAIN_STEPS={steps}"], timeout)
  resumed["checkpoint_steps"] = _checkpoint_steps(model_dir)
  report["train"] = {"first": first, "resumed": resumed,
                     "ok": first["exit_code"] == 0 and resumed["exit_code"] == 0
                     and first["checkpoint_steps"][-1:] == [steps // 2]
                     and resumed["checkpoint_steps"][-1:] == [steps]}
  eval_dir = work / "eval"
  evaluated = _command([sys.executable, "-m", "meshbayes.eval", "--gin_file=runs/eval.gin",
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
  inferred = _command([sys.executable, "-m", "meshbayes.infer", "--gin_file=runs/infer.gin",
                       "--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{model_dir}'",
                       f"--gin.BATCH_SIZE={batch_size}", f"--gin.INPUT_FILE='{inputs}'",
                       f"--gin.OUTPUT_FILE='{outputs}'"], timeout)
  inferred["outputs"] = outputs.read_text().splitlines() if outputs.is_file() else None
  inferred["ok"] = inferred["exit_code"] == 0 and inferred["outputs"] is not None \
      and len(inferred["outputs"]) == len(INPUTS.splitlines())
  report["infer"] = inferred
  return report


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="the JSON report's path")
  parser.add_argument("--toy", action="store_true",
                      help="tiny preset, 4 x 16 tokens, 4 + 4 train steps (runs on a CPU)")
  parser.add_argument("--presets", default=None,
                      help=f"comma-separated, from {', '.join(STEP_PRESETS)} "
                           f"(default {','.join(DEFAULT_PRESETS)}; --toy: tiny)")
  parser.add_argument("--rounds", type=int, default=5, help="timed rounds per step")
  parser.add_argument("--train_steps", type=int, default=None,
                      help="steps of the train part, an even number (default 50; --toy: 8); "
                           "0 leaves the train, eval and infer parts out")
  parser.add_argument("--step_only", default=None, help=argparse.SUPPRESS)  # one process's part
  parser.add_argument("--kinds", default=",".join(KINDS),
                      help=f"comma-separated steps to time, from {', '.join(KINDS)}")
  args = parser.parse_args(argv)
  known = TOY_PRESETS if args.toy else STEP_PRESETS
  args.presets = args.presets.split(",") if args.presets else \
      list(TOY_PRESETS if args.toy else DEFAULT_PRESETS)
  unknown = [p for p in args.presets + ([args.step_only] if args.step_only else [])
             if p not in known]
  if unknown:
    parser.error(f"--presets: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
  args.kinds = args.kinds.split(",")
  if not set(args.kinds) <= set(KINDS):
    parser.error(f"--kinds={','.join(args.kinds)}: choose from {', '.join(KINDS)}")
  if args.train_steps is None:
    args.train_steps = 8 if args.toy else 50
  if args.train_steps and (args.train_steps < 2 or args.train_steps % 2):
    parser.error(f"--train_steps={args.train_steps}: give an even number >= 2 (a checkpoint "
                 "halfway, then a resume), or 0")
  if args.rounds < 1:
    parser.error(f"--rounds={args.rounds}: give at least 1")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  presets = TOY_PRESETS if args.toy else STEP_PRESETS
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  if args.step_only:  # one preset's steps, in this process
    try:
      report = step_section(presets[args.step_only], args.kinds, args.rounds)
    except Exception:
      report = {"errors": {"section": traceback.format_exc()[-1500:]}}
    Path(args.out).write_text(report_text(report))
    return report
  import jax

  report: dict[str, Any] = {"devices": [str(d) for d in jax.devices()],
                            "device_kind": jax.devices()[0].device_kind,
                            "jax_version": jax.__version__, "toy": args.toy, "step": {}}
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="gpu_check-") as work:
    for name in args.presets:
      began = time.perf_counter()
      report["step"][name] = run_step_preset(name, presets[name], args, Path(work))
      report["step"][name]["seconds_total"] = time.perf_counter() - began
      Path(args.out).write_text(report_text(report))  # what a cut run keeps
    if args.train_steps:
      report.update(run_section(Path(work), args.train_steps, 8 if args.toy else 32,
                                timeout=300))
  parts = [report[part]["ok"] for part in ("train", "eval", "infer") if part in report]
  report["ok"] = all(not s.get("errors") for s in report["step"].values()) and all(parts)
  report["seconds"] = time.perf_counter() - start
  report["summary"] = summary(report["step"])
  Path(args.out).write_text(report_text(report))
  print(report_text(report), end="")
  print(report["summary"])
  return report


if __name__ == "__main__":
  main()
