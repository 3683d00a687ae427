"""One check of the project on an accelerator: step speed against the frozen model, then train,
resume, eval, infer.

Writes one JSON (``--out``) with four parts, each with its ``seconds``
(``meshbayes.scaling.gpu_check`` measures them):

- ``step``: the trainer's train step, deterministic and Bayesian, bf16, for the
  ``base`` preset (32 x 256 tokens, no remat), ``paper`` (8 x 256, full remat)
  and ``paper_no_remat`` (8 x 256: the Bayesian step, about 123 GB, and the
  deterministic one each in a process of their own). Each preset runs in a
  process of its own: seconds, traced matmul FLOPs, TFLOP/s and MFU, the peak
  memory in use, and beside each measured step the frozen step-time model's
  prediction. A step that fails (out of memory) records its ``error`` and the
  check goes on. ``--presets=base_gpu,paper_gpu`` times the step's shape chosen
  for GPUs instead (``hardware/gpu.gin``: layers unrolled, cuDNN attention, 128
  and 16 sequences; their compiles take minutes), ``--kinds`` one kind only.
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
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshbayes.scaling.gpu_check import (DEFAULT_PRESETS, KINDS, STEP_PRESETS, TOY_PRESETS,
                                         StepPreset, merge, report_text, run_command,
                                         run_section, step_section, summary)
from meshbayes.scaling.targets import GPU_MEMORY_FRACTION


def run_step_preset(name: str, step: StepPreset, args: argparse.Namespace, work: Path
                    ) -> dict[str, Any]:
  """A preset's step section in a process of its own (or one per kind), merged."""
  groups = [[kind] for kind in args.kinds] if step.separate else [list(args.kinds)]
  parts = []
  for kinds in groups:
    out = work / f"step-{name}-{'-'.join(kinds)}.json"
    command = [sys.executable, "-m", "meshbayes.tools.gpu_check", f"--out={out}",
               f"--step_only={name}", f"--kinds={','.join(kinds)}", f"--rounds={args.rounds}"]
    done = run_command(command + (["--toy"] if args.toy else []), timeout=420,
                       # The share of memory the GPU targets' usable memory is stated against.
                       env={"XLA_PYTHON_CLIENT_MEM_FRACTION": str(GPU_MEMORY_FRACTION),
                            **os.environ})
    if out.is_file():
      parts.append(json.loads(out.read_text()))
    else:
      parts.append({"errors": {",".join(kinds): f"the process ended with {done['exit_code']}: "
                                                f"{done['stderr_tail'][-600:]}"}})
  return merge(parts)


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
