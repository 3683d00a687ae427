"""Benchmarks of the cost of being Bayesian, as ratios measured in one run; prints a JSON report.

Every figure compares programs timed in the same process, alternating round
after round so that machine load hits all sides alike; each side's time is its
fastest round, the medians reported too. The goals and the measured figures
are in docs/results/2026-11-cpu-train-step.md; how they are measured, docs/performance.md.

Sections (``--sections``, default all): ``step`` (the trainer's train step of
``--step_model``, deterministic vs Bayesian and IVON vs AdamW; ``--step_ivon_ablations``,
``--step_noise_ablations``; ``--step_target=h200:1`` or ``h100:N`` compiles it for that
GPU instead, without one, with the ``gpu-aot`` extra: the frozen step-time model's
figures), ``layers`` (one Dense layer per estimator against the deterministic one),
``decode`` (posterior mean vs model averaging over S samples; memory per S): all in
``meshbayes.scaling.benchmarks``; ``pipeline`` (the input pipeline against the trainer's
consumption, per task of ``--pipeline_tasks``; ``tatoeba_enfr`` needs ``make data``),
``trainer`` (the trainer's step against the bare compiled step), ``resume`` (seconds to
a resumed run's first step): in ``meshbayes.scaling.trainer_benchmarks``.

On CPUs the step time depends on ``MESHBAYES_MALLOC`` (``meshbayes/runtime/host_memory.py``);
the report's ``malloc`` says which tunables a run had.

  python -m meshbayes.tools.bench                      # all sections
  python -m meshbayes.tools.bench --sections=layers --rows=2048 --in_features=1024 --out_features=4096
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

from meshbayes.runtime import host_memory, strict_json
from meshbayes.scaling import benchmarks, trainer_benchmarks
from meshbayes.scaling.aot import parse_overrides
from meshbayes.scaling.targets import parse_gpu_target
from meshbayes.scaling.trainer_benchmarks import PIPELINE_DEMOS

SECTIONS = ("step", "layers", "pipeline", "decode", "trainer", "resume")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sections", default=",".join(SECTIONS),
                      help=f"comma-separated, from {', '.join(SECTIONS)}")
  parser.add_argument("--rounds", type=int, default=5, help="timed rounds per program")
  parser.add_argument("--step_model", default="small")
  # 16 x 64 = 1,024 tokens per step: what each core of the paper's v2-512 run processes.
  parser.add_argument("--step_batch", type=int, default=16)
  parser.add_argument("--step_length", type=int, default=64)
  parser.add_argument("--step_rounds", type=int, default=3)
  parser.add_argument("--step_dtype", default=None, help="compute dtype (default: the preset's)")
  parser.add_argument("--step_remat", default=None,
                      help="none, full or minimal (default: the preset's)")
  parser.add_argument("--step_overrides", default="",
                      help="TransformerConfig fields of the step's model, e.g. "
                           "scan_layers=False,attention_dropout_rate=0.0")
  parser.add_argument("--step_target", default=None,
                      help="a GPU (h100:N, h200:N) to compile the step for, without running "
                           "it: the frozen step-time model's seconds, TFLOP/s and MFU")
  parser.add_argument("--step_ivon_ablations", action="store_true",
                      help="also time IVON's step without its noise draw and without its "
                           "posterior-stddev metrics (where its excess over AdamW goes)")
  parser.add_argument("--step_noise_ablations", action="store_true",
                      help="also time the Bayesian step with its noise stored instead of "
                           "regenerated, and with the local reparameterization's variance "
                           "kept (what regenerating costs)")
  parser.add_argument("--rows", type=int, default=2048)
  parser.add_argument("--in_features", type=int, default=1024)
  parser.add_argument("--out_features", type=int, default=4096)
  parser.add_argument("--prng_impls", default="default,rbg",
                      help="key implementations for the layer section ('default': jax's)")
  parser.add_argument("--jax_noise", action=argparse.BooleanOptionalAction, default=True,
                      help="also time each Bayesian layer with jax.random's samplers")
  parser.add_argument("--stored_noise", action=argparse.BooleanOptionalAction, default=True,
                      help="also time each Bayesian layer with its noise stored for the "
                           "backward pass, not drawn again (what regenerating costs)")
  parser.add_argument("--pipeline_seconds", type=float, default=5.0)
  parser.add_argument("--pipeline_tasks", default="tatoeba_enfr,synthetic_reverse",
                      help=f"from {', '.join(PIPELINE_DEMOS)}")
  parser.add_argument("--decode_model", default="tiny")
  parser.add_argument("--decode_batch", type=int, default=32)
  parser.add_argument("--decode_length", type=int, default=16)
  parser.add_argument("--decode_method", default="greedy", choices=("greedy", "beam", "sample"))
  parser.add_argument("--decode_samples", default="1,4")
  parser.add_argument("--decode_memory_model", default="small")
  parser.add_argument("--decode_memory_samples", default="1,4,8")
  parser.add_argument("--trainer_models", default="tiny,small")
  parser.add_argument("--trainer_steps", default="200,12",
                      help="timed steps per trainer run, one per --trainer_models entry")
  parser.add_argument("--resume_task", default="tatoeba_enfr",
                      help=f"from {', '.join(PIPELINE_DEMOS)}")
  parser.add_argument("--resume_step", type=int, default=10_000)
  parser.add_argument("--json", default=None, help="also write the report here")
  args = parser.parse_args(argv)
  unknown = set(args.sections.split(",")) - set(SECTIONS)
  if unknown:
    parser.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from "
                 f"{', '.join(SECTIONS)}")
  try:
    args.step_overrides = parse_overrides(args.step_overrides)
  except ValueError as error:
    parser.error(f"--step_overrides: {error}")
  if args.step_target:
    try:
      args.step_target = parse_gpu_target(args.step_target)
    except ValueError as error:
      parser.error(f"--step_target: {error}")
  if len(args.trainer_models.split(",")) != len(args.trainer_steps.split(",")):
    parser.error(f"--trainer_steps={args.trainer_steps}: give one count per --trainer_models "
                 f"entry ({args.trainer_models})")
  unknown = set(args.pipeline_tasks.split(",") + [args.resume_task]) - set(PIPELINE_DEMOS)
  if unknown:
    parser.error(f"--pipeline_tasks, --resume_task: unknown {', '.join(sorted(unknown))}; "
                 f"choose from {', '.join(PIPELINE_DEMOS)}")
  return args



def _step(args: argparse.Namespace) -> dict[str, Any]:
  shape = dict(model=args.step_model, batch_size=args.step_batch, length=args.step_length,
               dtype=args.step_dtype, remat_policy=args.step_remat,
               overrides=args.step_overrides)
  if args.step_target:
    try:
      return benchmarks.gpu_step_prediction(args.step_target, **shape)
    except RuntimeError as error:  # a step did not compile
      raise SystemExit(str(error)) from None
  return benchmarks.step_ratios(rounds=args.step_rounds, ivon_ablations=args.step_ivon_ablations,
                                noise_ablations=args.step_noise_ablations, **shape)


def _decode(args: argparse.Namespace) -> dict[str, Any]:
  ints = lambda text: [int(s) for s in text.split(",")]
  return {**benchmarks.decode_rates(args.decode_model, args.decode_batch, args.decode_length,
                                    args.decode_method, ints(args.decode_samples), args.rounds),
          "memory": benchmarks.decode_memory(args.decode_memory_model, args.decode_batch,
                                             args.decode_length, args.decode_method,
                                             ints(args.decode_memory_samples))}


RUNNERS = {
    "step": _step,
    "layers": lambda args: benchmarks.layer_ratios(
        args.rows, args.in_features, args.out_features, args.prng_impls.split(","),
        args.rounds, args.jax_noise, args.stored_noise),
    "pipeline": lambda args: {task: trainer_benchmarks.pipeline_against_trainer(
        task, args.pipeline_seconds) for task in args.pipeline_tasks.split(",")},
    "decode": _decode,
    "trainer": lambda args: trainer_benchmarks.trainer_overheads(
        dict(zip(args.trainer_models.split(","), map(int, args.trainer_steps.split(",")))),
        args.step_batch, args.step_length, args.step_rounds),
    "resume": lambda args: trainer_benchmarks.resume_at_step(args.resume_task, args.resume_step),
}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  report: dict[str, Any] = {"devices": [str(d) for d in jax.devices()],
                            "jax_version": jax.__version__, "rounds": args.rounds,
                            # The malloc settings it ran with (meshbayes.runtime.host_memory).
                            "malloc": host_memory.malloc_settings()}
  for section in args.sections.split(","):
    start = time.perf_counter()
    report[section] = RUNNERS[section](args)
    report[section]["bench_seconds"] = time.perf_counter() - start
  text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=2)
  print(text)
  if args.json:
    Path(args.json).write_text(text + "\n")
  return report


if __name__ == "__main__":
  host_memory.exec_with_malloc_tunables()
  main()
