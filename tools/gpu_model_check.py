"""A frozen GPU step-time model against the steps measured on an H200, on deviceless compiles.

Builds the code that was measured (each step's own commit, ``MeasuredStep.commit``, or
``--commit`` for all, from this repository's git history, installed without
dependencies into a temporary folder), compiles each measured step of
``MEASURED_H200_STEPS`` for an H200 without a GPU (``tools/deviceless_compile.py`` under
that code, with ``targets.GPU_COMPILER_OPTIONS`` unless ``--triton_gemm``), and sets the
frozen model's prediction (``--model``: ``v1``, ``roofline.FROZEN_GPU_MODEL``, or ``v2``,
``FROZEN_GPU_MODEL_V2``) from each program against the measured seconds. Needs JAX's
CUDA plugin (the ``gpu-aot`` extra) and git.

  python -m meshbayes.tools.gpu_model_check --json=runs/gpu_model_check.json \\
      [--model=v2] [--hlo_dir=tests/scaling/data/h200_deviceless] [--triton_gemm]

Prints a markdown table; ``ok`` (and the exit status) says whether every
prediction is within ``--tolerance`` (10%) of the measured step.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshbayes.runtime import strict_json
from meshbayes.scaling import frozen_model_check, roofline, targets
from meshbayes.scaling.measured_steps import MEASURED_H200_STEPS

DEVICELESS_COMPILE = Path(__file__).with_name("deviceless_compile.py")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", required=True, help="the report's path")
  parser.add_argument("--model", default="v1", choices=sorted(roofline.GPU_MODELS),
                      help="the frozen model to check (default v1; v2 is provisional)")
  parser.add_argument("--commit", default=None,
                      help="the code to compile for every step (default: each step's own "
                           "measured commit)")
  parser.add_argument("--repository", default=str(Path(__file__).resolve().parents[1]),
                      help="the git checkout that holds the commits")
  parser.add_argument("--hlo_dir", default=None,
                      help="keep the compiled programs here (NAME.hlo.txt.gz)")
  parser.add_argument("--steps", default=",".join(s.name for s in MEASURED_H200_STEPS),
                      help="comma-separated measured steps to check (default: all)")
  parser.add_argument("--triton_gemm", action="store_true",
                      help="leave XLA's deviceless default (Triton for every matmul)")
  parser.add_argument("--tolerance", type=float, default=0.10)
  args = parser.parse_args(argv)
  known = {s.name: s for s in MEASURED_H200_STEPS}
  unknown = [n for n in args.steps.split(",") if n not in known]
  if unknown:
    parser.error(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
  args.steps = [known[n] for n in args.steps.split(",")]
  if not targets.gpu_aot_available():
    parser.error("JAX's CUDA plugin is not installed: run this in the gpu-aot venv "
                 "(make test-gpu-aot makes it)")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  report = frozen_model_check.check(
      args.steps, args.commit, Path(args.repository), DEVICELESS_COMPILE,
      hlo_dir=Path(args.hlo_dir) if args.hlo_dir else None, triton_gemm=args.triton_gemm,
      tolerance=args.tolerance, model=roofline.gpu_model(args.model))
  report = {"model_name": args.model, **report}
  Path(args.json).parent.mkdir(parents=True, exist_ok=True)
  text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=1)
  Path(args.json).write_text(text + "\n")
  print(f"frozen model {args.model}\n\n" + frozen_model_check.markdown(report["steps"])
        + f"ok: {report['ok']}")
  return report


if __name__ == "__main__":
  sys.exit(0 if main()["ok"] else 1)
