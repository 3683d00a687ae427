"""Where the train step's time goes, by kind of work: the compiled program and a profile.

Compiles the trainer's step of a preset, deterministic and Bayesian (both
AdamW), and splits each by kind of work (``meshbayes.scaling.step_operations``
says how). Sections (``--sections``, default ``time``):

- ``time``: each program's operations (FLOPs, transcendentals, bytes) and their
  seconds in a ``jax.profiler`` trace of ``--profile_steps`` steps, by kind;
  ``--ablations`` times the Bayesian step with one kind of work taken out
  (``meshbayes.scaling.ablations``) alternating with the real step.
- ``buffers``: compiled for one CPU device, not run: the buffers live at each
  program's memory peak, by kind (``meshbayes.scaling.peak_buffers``).
- ``gpu``: compiled for ``--target`` (JAX's CUDA plugin, the ``gpu-aot`` extra,
  no GPU), not run: the frozen step-time model's seconds, kernels and HBM bytes
  by kind of work (``meshbayes.scaling.step_profile.gpu_report``).

  python -m meshbayes.tools.step_profile                       # small, 16 x 64 tokens
  python -m meshbayes.tools.step_profile --ablations --json=runs/step_profile.json
  python -m meshbayes.tools.step_profile --sections=buffers --model=base --batch=24 \\
      --length=192 --dtype=bfloat16
  python -m meshbayes.tools.step_profile --sections=gpu --target=h200:1 --model=base \\
      --batch=32 --length=256 --dtype=bfloat16 --remat_policy=none
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

from meshbayes.runtime import host_memory, strict_json
from meshbayes.scaling import peak_buffers, step_profile
from meshbayes.scaling.step_spec import step_spec
from meshbayes.scaling.targets import parse_gpu_target

SECTIONS = ("time", "buffers", "gpu")
PROGRAMS = (("deterministic", True), ("bayesian", False))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="small")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=64)
  parser.add_argument("--profile_steps", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds (alternating)")
  parser.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=False)
  parser.add_argument("--top", type=int, default=15, help="slowest operations listed")
  parser.add_argument("--json", default=None, help="also write the report here")
  parser.add_argument("--sections", default="time",
                      help="comma-separated: time (work and profiled seconds by kind), "
                           "buffers (the memory peak's buffers by kind; compiled, not run), "
                           "gpu (the frozen model's seconds by kind on --target; compiled)")
  parser.add_argument("--target", default="h200:1", help="the gpu section's GPU: h100:N, h200:N")
  parser.add_argument("--dtype", default=None, help="compute dtype (default: the preset's)")
  parser.add_argument("--remat_policy", default=None, help="none, full or minimal (default: "
                      "the preset's)")
  args = parser.parse_args(argv)
  sections = [s for s in args.sections.split(",") if s]
  unknown = sorted(set(sections) - set(SECTIONS))
  if unknown or not sections:
    parser.error(f"--sections={args.sections!r}: {', '.join(unknown) or 'none given'} not "
                 f"among {', '.join(SECTIONS)}")
  args.sections = sections
  if "gpu" in sections:
    try:
      args.target = parse_gpu_target(args.target)
    except ValueError as error:
      parser.error(f"--target: {error}")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  spec = step_spec(args.model, args.batch, args.length, deterministic=False,
                   dtype=args.dtype, remat_policy=args.remat_policy)
  report: dict[str, Any] = {"model": args.model, "batch_size": args.batch,
                            "length": args.length, "dtype": args.dtype,
                            "remat_policy": args.remat_policy,
                            "devices": [str(d) for d in jax.devices()]}
  if "buffers" in args.sections:
    report["buffers"] = {name: peak_buffers.buffer_report(
        spec.replace(deterministic=deterministic), args.top) for name, deterministic in PROGRAMS}
    print(peak_buffers.buffers_markdown(report["buffers"]))
  if "gpu" in args.sections:
    try:
      report["gpu"] = {"target": args.target.name, **{
          name: step_profile.gpu_report(spec.replace(deterministic=deterministic), args.target)
          for name, deterministic in PROGRAMS}}
    except RuntimeError as error:  # the step did not compile
      raise SystemExit(str(error)) from None
    print(step_profile.gpu_markdown(report["gpu"]))
  if "time" in args.sections:
    report.update(step_profile.time_report(spec, args.profile_steps, args.rounds,
                                           args.ablations, args.top))
    print(step_profile.markdown(report))
  if args.json:
    text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=2)
    Path(args.json).write_text(text + "\n")
  return report


if __name__ == "__main__":
  host_memory.exec_with_malloc_tunables()
  main()
