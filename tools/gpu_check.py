"""One check of the project on an accelerator: step speed with MFU, then train, resume, eval, infer.

Writes one JSON (``--out``) with four parts, each with its ``seconds``:

- ``step``: the trainer's jitted train step (``bench.compiled_train_step``, one
  device, ``data_only`` rules), deterministic and Bayesian (both AdamW), for the
  ``base`` preset (32 x 256 tokens, bf16, no remat) and ``paper`` (8 x 256, bf16,
  full remat), timed round-robin (``bench.alternate``): seconds, traced matmul
  FLOPs, TFLOP/s and MFU (``scaling.peaks``), the compiled programs' FLOPs
  (``scaling.hlo``). A step that fails (out of memory) records its ``error``
  and the check goes on.
- ``train``: ``python -m meshbayes.train`` of
  ``gin_configs/examples/tiny_synthetic_bayesian.gin`` to step 25 (checkpoint),
  then again to 50 (a resume from that checkpoint); the checkpoint steps after each.
- ``eval``: ``python -m meshbayes.eval`` on the run (teacher-forced, one batch): its metrics.json.
- ``infer``: ``python -m meshbayes.infer`` on three lines of the synthetic task.

``ok`` is true when every part succeeded. About 6 minutes on one H100 or H200
(mostly compiles). ``--toy`` runs the tiny preset at 4 x 16 tokens and 4 + 4
train steps, on a CPU in about a minute. On a lent GPU (docs/performance.md):

  PYTHONPATH=/tmp/site JAX_PLATFORMS=cuda python -m meshbayes.tools.gpu_check --out=gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXAMPLE = "gin_configs/examples/tiny_synthetic_bayesian.gin"
# (preset, batch, length, remat policy): the shared H200 measurement's settings.
STEP_PRESETS = {"base": ("base", 32, 256, "none"), "paper": ("paper", 8, 256, "full")}
TOY_PRESETS = {"tiny": ("tiny", 4, 16, "none")}
INPUTS = "5 6 7 8\n9 10 11\n2 3\n"


def step_section(preset: str, batch_size: int, length: int, remat: str, rounds: int
                 ) -> dict[str, Any]:
  """Deterministic and Bayesian train steps of one preset, timed together, with MFU."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from meshbayes.partitioning import Partitioner
  from meshbayes.scaling import hlo, peaks
  from meshbayes.scaling.aot import StepSpec
  from meshbayes.tools import bench

  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])
  rng = np.random.default_rng(0)
  programs, flops, states, errors = {}, {}, {}, {}
  for kind, deterministic in (("deterministic", True), ("bayesian", False)):
    spec = StepSpec(model=preset, deterministic=deterministic, optimizer="adamw",
                    batch_size=batch_size, input_length=length, target_length=length,
                    model_parallel=1, partitioning="data_only", num_train_units=1e6,
                    overrides=(("dtype", "bfloat16"), ("remat_policy", remat)))
    shapes = spec.input_shapes()
    batch = {name: jnp.asarray(rng.integers(1, spec.config().vocab_size, size=shape), jnp.int32)
             for name, shape in shapes.items()}
    batch["decoder_loss_weights"] = jnp.ones(shapes["decoder_loss_weights"], jnp.int32)
    try:
      start = time.perf_counter()
      states[kind], compiled = bench.compiled_train_step(spec, partitioner, batch)
      compile_seconds = time.perf_counter() - start
      summary = hlo.analyze(compiled.as_text())
      flops[kind] = {"traced_matmul": bench.traced_step_flops(spec, partitioner, batch),
                     "hlo_matmul": summary.matmul_flops, "compile_seconds": compile_seconds}
    except Exception as error:  # an out-of-memory compile: recorded, the others still run
      errors[kind] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
      continue

    def run(name=kind, fn=compiled, data=batch):
      states[name], metrics = fn(states[name], data)  # the old state is donated
      return metrics["loss"]

    programs[kind] = run
  report: dict[str, Any] = {"preset": preset, "batch_size": batch_size, "length": length,
                            "remat_policy": remat, "dtype": "bfloat16", "flops": flops,
                            "errors": errors}
  try:
    times, medians = bench.alternate(programs, rounds, warmup=1) if programs else ({}, {})
  except Exception as error:  # out of memory at run time
    errors["run"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return report
  device = jax.devices()[0]
  report.update({"seconds": times, "median_seconds": medians,
                 **peaks.utilization({k: f["traced_matmul"] for k, f in flops.items()}, times,
                                     device.device_kind, device.platform)})
  if len(times) == 2:
    report["time_ratio"] = times["bayesian"] / times["deterministic"]
    report["efficiency_quotient"] = report["time_ratio"] / (
        flops["bayesian"]["traced_matmul"] / flops["deterministic"]["traced_matmul"])
  return report


def _command(args: list[str], timeout: float) -> dict[str, Any]:
  start = time.perf_counter()
  try:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
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
                        "--gin.evaluate.decode=False", f"--gin.evaluate.output_dir='{eval_dir}'"],
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
                           "(default all; --toy: tiny)")
  parser.add_argument("--rounds", type=int, default=5, help="timed rounds per step")
  parser.add_argument("--train_steps", type=int, default=None,
                      help="steps of the train part, an even number (default 50; --toy: 8)")
  args = parser.parse_args(argv)
  known = TOY_PRESETS if args.toy else STEP_PRESETS
  args.presets = args.presets.split(",") if args.presets else list(known)
  unknown = [p for p in args.presets if p not in known]
  if unknown:
    parser.error(f"--presets: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
  args.train_steps = args.train_steps or (8 if args.toy else 50)
  if args.train_steps < 2 or args.train_steps % 2:
    parser.error(f"--train_steps={args.train_steps}: give an even number >= 2 (a checkpoint "
                 "halfway, then a resume)")
  if args.rounds < 1:
    parser.error(f"--rounds={args.rounds}: give at least 1")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  import jax

  presets = TOY_PRESETS if args.toy else STEP_PRESETS
  report: dict[str, Any] = {"devices": [str(d) for d in jax.devices()],
                            "device_kind": jax.devices()[0].device_kind,
                            "jax_version": jax.__version__, "toy": args.toy, "step": {}}
  start = time.perf_counter()
  for name in args.presets:
    began = time.perf_counter()
    try:
      report["step"][name] = step_section(*presets[name], rounds=args.rounds)
    except Exception:
      report["step"][name] = {"errors": {"section": traceback.format_exc()[-1500:]}}
    report["step"][name]["seconds_total"] = time.perf_counter() - began
  with tempfile.TemporaryDirectory(prefix="gpu_check-") as work:
    report.update(run_section(Path(work), args.train_steps, 8 if args.toy else 32,
                              timeout=300))
  report["ok"] = (all(not s.get("errors") for s in report["step"].values())
                  and all(report[part]["ok"] for part in ("train", "eval", "infer")))
  report["seconds"] = time.perf_counter() - start
  text = json.dumps(report, indent=2)
  Path(args.out).write_text(text + "\n")
  print(text)
  return report


if __name__ == "__main__":
  main()
