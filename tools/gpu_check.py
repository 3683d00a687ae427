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
  and 16 sequences; their compiles take minutes), ``--kinds`` one kind only. Beside each
  measured step both frozen models' predictions: v1 (``predicted``) and v2
  (``predicted_v2``, which charges cuDNN's fused attention at its measured rate).
- ``attention`` (``--plan`` only): attention alone, forward and backward, at the presets'
  shapes, beside the v2 model's charge (``meshbayes.scaling.attention_alone``).
- ``train``: ``python -m meshbayes.train`` of
  ``gin_configs/examples/tiny_synthetic_bayesian.gin`` to step 25 (checkpoint),
  then again to 50 (a resume from that checkpoint); the checkpoint steps after each.
- ``eval``: ``python -m meshbayes.eval`` on the run (teacher-forced, one batch): its metrics.json.
- ``infer``: ``python -m meshbayes.infer`` on three lines of the synthetic task.

``--plan=v2`` runs, in this order, one gpu.gin step with cuDNN's fused attention (base,
128 x 256, deterministic: it confirms the v2 model or not), attention alone at paper's and
base's shapes, the same base step with XLA's attention (cuDNN against XLA, measured),
then base's Bayesian step, paper's deterministic step at 32 x 256 and its Bayesian step
at 16 x 256 (each kind in a process of its own), as ``--max_seconds`` allows; without
train parts unless ``--train_steps`` asks for them.

``ok`` is true when every part succeeded. At most ``--max_seconds`` (480: 8 minutes) on
one H100 or H200 (mostly compiles; ``paper_no_remat``'s Bayesian step fits an H200
only): no part starts after it, a part still running then is stopped (its error
recorded), and the JSON is written after each part, so a run cut short keeps what it
finished. ``--toy`` runs the tiny preset at 4 x 16 tokens and 4 + 4 train steps, on a
CPU in a few minutes, without a time limit (``--plan=v2 --toy``: the plan's items at
that size, XLA's attention in place of cuDNN's). On a lent GPU (docs/performance.md):

  PYTHONPATH=/tmp/site JAX_PLATFORMS=cuda python -m meshbayes.tools.gpu_check --out=gpu_check.json
  PYTHONPATH=/tmp/site JAX_PLATFORMS=cuda python -m meshbayes.tools.gpu_check --plan=v2 \\
      --out=gpu_check_v2.json --rounds=3
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

from meshbayes.scaling.attention_alone import SHAPES, TOY_SHAPES, attention_section
from meshbayes.scaling.gpu_check import (DEFAULT_PRESETS, KINDS, PLANS, STEP_PRESETS,
                                         TOY_PLANS, TOY_PRESETS, StepPreset, merge,
                                         report_text, run_command, run_section, step_section,
                                         summary)
from meshbayes.scaling.targets import GPU_MEMORY_FRACTION


def _child(args: argparse.Namespace, out: Path, part: list[str], timeout: float
           ) -> dict[str, Any]:
  """One part of the check in a process of its own (JAX and the GPU in it alone): its
  report, or the error it ended with."""
  command = [sys.executable, "-m", "meshbayes.tools.gpu_check", f"--out={out}",
             f"--rounds={args.rounds}", *part]
  done = run_command(command + (["--toy"] if args.toy else []), timeout=timeout,
                     # The share of memory the GPU targets' usable memory is stated against.
                     env={"XLA_PYTHON_CLIENT_MEM_FRACTION": str(GPU_MEMORY_FRACTION),
                          **os.environ})
  if out.is_file():
    return json.loads(out.read_text())
  return {"errors": {" ".join(part): f"the process ended with {done['exit_code']}: "
                                     f"{done['stderr_tail'][-600:]}"}}


def run_step_preset(name: str, step: StepPreset, args: argparse.Namespace, work: Path,
                    kinds: Sequence[str] | None = None, timeout: float = 420
                    ) -> dict[str, Any]:
  """A preset's step section (``kinds``, default ``--kinds``) in a process of its own (or
  one per kind), merged."""
  kinds = list(kinds or args.kinds)
  groups = [[kind] for kind in kinds] if step.separate else [kinds]
  return merge([_child(args, work / f"step-{name}-{'-'.join(group)}.json",
                       [f"--step_only={name}", f"--kinds={','.join(group)}"], timeout)
                for group in groups])


def plan_items(args: argparse.Namespace) -> list[tuple]:
  """The run's parts in order: the plan's, or each preset's steps."""
  if args.plan:
    return list((TOY_PLANS if args.toy else PLANS)[args.plan])
  return [("step", name, tuple(args.kinds)) for name in args.presets]


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
  parser.add_argument("--plan", default=None, choices=sorted(PLANS),
                      help="run a plan's parts in order instead of --presets (see above)")
  parser.add_argument("--max_seconds", type=float, default=None,
                      help="no part starts after this, one running is stopped (default 480; "
                           "--toy: no limit)")
  parser.add_argument("--step_only", default=None, help=argparse.SUPPRESS)  # one process's part
  parser.add_argument("--attention_only", default=None, help=argparse.SUPPRESS)
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
  shapes = TOY_SHAPES if args.toy else SHAPES
  args.attention_only = args.attention_only.split(",") if args.attention_only else None
  unknown = [s for s in args.attention_only or () if s not in shapes]
  if unknown:
    parser.error(f"--attention_only: unknown {', '.join(unknown)}; choose from "
                 f"{', '.join(shapes)}")
  if args.max_seconds is None:
    args.max_seconds = 0.0 if args.toy else 480.0
  if args.max_seconds < 0:
    parser.error(f"--max_seconds={args.max_seconds:g}: give 0 (no limit) or more")
  args.kinds = args.kinds.split(",")
  if not set(args.kinds) <= set(KINDS):
    parser.error(f"--kinds={','.join(args.kinds)}: choose from {', '.join(KINDS)}")
  if args.train_steps is None:
    args.train_steps = 0 if args.plan else 8 if args.toy else 50
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
  if args.step_only or args.attention_only:  # one part, in this process
    try:
      report = step_section(presets[args.step_only], args.kinds, args.rounds) \
          if args.step_only else attention_section(
              {s: (TOY_SHAPES if args.toy else SHAPES)[s] for s in args.attention_only},
              args.rounds)
    except Exception:
      report = {"errors": {"section": traceback.format_exc()[-1500:]}}
    Path(args.out).write_text(report_text(report))
    return report
  import jax

  report: dict[str, Any] = {"devices": [str(d) for d in jax.devices()],
                            "device_kind": jax.devices()[0].device_kind,
                            "jax_version": jax.__version__, "toy": args.toy,
                            "plan": args.plan, "step": {}}
  start = time.perf_counter()
  left = lambda: args.max_seconds - (time.perf_counter() - start) if args.max_seconds \
      else float("inf")
  with tempfile.TemporaryDirectory(prefix="gpu_check-") as work:
    for item in plan_items(args):
      if left() <= 0:
        report.setdefault("not_run", []).append(" ".join(str(part) for part in item))
        continue
      began, timeout = time.perf_counter(), min(420.0, left())
      if item[0] == "attention":
        report["attention"] = _child(args, Path(work) / "attention.json",
                                     [f"--attention_only={','.join(item[1])}"], timeout)
      else:
        _, name, kinds = item
        part = run_step_preset(name, presets[name], args, Path(work), kinds, timeout)
        seconds = report["step"].get(name, {}).get("seconds_total", 0.0)
        report["step"][name] = merge([report["step"][name], part]) \
            if name in report["step"] else part
        report["step"][name]["seconds_total"] = seconds + time.perf_counter() - began
      Path(args.out).write_text(report_text(report))  # what a cut run keeps
    if args.train_steps and left() > 0:
      report.update(run_section(Path(work), args.train_steps, 8 if args.toy else 32,
                                timeout=min(300.0, left())))
  parts = [report[part]["ok"] for part in ("train", "eval", "infer") if part in report]
  report["ok"] = all(not s.get("errors") for s in report["step"].values()) and all(parts) \
      and not (report.get("attention") or {}).get("errors") and "not_run" not in report
  report["seconds"] = time.perf_counter() - start
  report["summary"] = summary(report["step"], report.get("attention"))
  Path(args.out).write_text(report_text(report))
  print(report_text(report), end="")
  print(report["summary"])
  return report


if __name__ == "__main__":
  main()
