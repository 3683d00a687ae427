"""Sequence calibration with enough positives: the deterministic and Bayesian-layer
translation recipes trained on the full Tatoeba corpus on a lent GPU, decoded there, scored here.

On the 20k-pair subset only 1-4% of decoded test outputs match a reference, far below the
~400 positives a sequence ECE needs (docs/uncertainty.md, "The measures"). Three steps:

- ``export`` (here, with seqio): the task's splits as uint16 token ids and its test split
  grouped by source, into one compressed ``.npz`` (``evaluation.token_arrays.export``).
- ``run`` (on the GPU; neither seqio nor TensorFlow is imported, and an import of either
  fails): each recipe of ``gin_configs/uncertainty/`` (its model, optimizer, KL weight,
  batch and seed; the vocabulary size and KL divisor from the export) trained with the
  trainer's own step and loop (``training.array_training``) for ``--train_steps`` or
  ``--train_seconds``, whichever ends first; then each predictive (the deterministic model;
  the Bayesian model average of S weight samples and its posterior mean) beam-decodes every
  test source and gives its teacher-forced token statistics (``token_arrays.predict``).
  Writes ``OUT/<recipe>.npz`` and ``OUT/run.json`` (steps, losses, seconds).
- ``score`` (here): every figure of ``evaluation.items`` with bootstrap intervals over
  sources (BLEU, exact match and its positives, sequence ECE with its null band,
  reference-fraction ECE, decoded-token ECE, calibration AUROC; ``token_arrays.score``), as
  a markdown table (and ``--json``).

  python -m meshbayes.tools.gpu_sequence_run export --task=tatoeba_enfr --out=runs/gpu_arrays/tatoeba_enfr.npz
  PYTHONPATH=/tmp/site JAX_PLATFORMS=cuda python -m meshbayes.tools.gpu_sequence_run run \\
    --arrays=runs/gpu_arrays/tatoeba_enfr.npz --out=$OUT --train_seconds=100
  python -m meshbayes.tools.gpu_sequence_run score --arrays=runs/gpu_arrays/tatoeba_enfr.npz \\
    --outputs=OUT --markdown=runs/gpu_sequence/table.md

The library parts: ``data.arrays``, ``training.array_training``, ``evaluation.token_arrays``;
the gin recipes are read here. The whole device sequence (wheels, carry, time budget):
docs/experiment.md, "On a GPU: sequence calibration with positives".
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gin
import numpy as np

from meshbayes.data.arrays import load_arrays
from meshbayes.runtime import strict_json

RECIPES = ("deterministic", "bayesian")
# Never imported by ``run``: the lent GPU has neither.
REFUSED_MODULES = ("seqio", "tensorflow")


def refuse_imports() -> None:
  """Makes seqio and TensorFlow absent, as on the lent GPU: an import fails and
  ``importlib.util.find_spec`` finds nothing (``sys.modules[name] = None``).

  Raises:
    ValueError: one of them is imported already.
  """
  loaded = [name for name in REFUSED_MODULES if sys.modules.get(name) is not None]
  if loaded:
    raise ValueError(f"run: {', '.join(loaded)} already imported in this process; run it in "
                     "a process of its own")
  for name in REFUSED_MODULES:
    sys.modules[name] = None


def parse_gin(path: Path, bindings: Sequence[str]) -> None:
  """Parses ``path`` and ``bindings`` into a cleared gin configuration, includes searched for
  in the presets (and a ``runs/`` folder in the working directory not taken for a package)."""
  import meshbayes.configurables  # noqa: F401  (the names the presets bind)
  from meshbayes.gin_configs import DIRECTORY
  from meshbayes.runtime import gin_preflight

  gin.clear_config()
  gin.add_config_file_search_path(str(DIRECTORY))
  gin_preflight.safe_existence_checks()  # as launch does
  with gin_preflight.quiet_search_misses():
    gin.parse_config_files_and_bindings([str(path)], list(bindings))


def task_lengths(task: str) -> dict[str, int]:
  """``TASK_FEATURE_LENGTHS`` of ``gin_configs/tasks/<task>.gin``."""
  from meshbayes.gin_configs import DIRECTORY

  path = DIRECTORY / "tasks" / f"{task}.gin"
  if not path.exists():
    raise ValueError(f"--task={task}: no {path} to take its feature lengths from")
  try:
    parse_gin(path, [])
    return dict(gin.query_parameter("%TASK_FEATURE_LENGTHS"))
  finally:
    gin.clear_config()


def recipe(name: str, meta: dict[str, Any], bindings: Sequence[str]) -> dict[str, Any]:
  """The recipe ``gin_configs/uncertainty/<name>.gin`` with the export's vocabulary size,
  lengths and KL divisor, and ``bindings``: its model, optimizer, KL weight, batch size, seed."""
  from meshbayes.gin_configs import DIRECTORY

  given = ["MODEL_DIR = 'unused'", "TRAIN_STEPS = 1",  # the trainer's, never called here
           f"TASK_FEATURE_LENGTHS = {meta['feature_lengths']!r}",
           f"models.TransformerConfig.vocab_size = {meta['vocab_size']}",
           f"models.EncoderDecoderModel.num_train_units = {float(meta['num_train_units'])}",
           *bindings]
  try:
    parse_gin(DIRECTORY / "uncertainty" / f"{name}.gin", given)
    return {"model": gin.get_configurable("models.EncoderDecoderModel")(),
            "optimizer": gin.get_configurable("optimizers.Optimizer")(),
            "kl_weight": gin.get_configurable("optimizers.KLWeight")(),
            "batch_size": int(gin.query_parameter("%BATCH_SIZE")),
            "seed": int(gin.query_parameter("%SEED")), "config": gin.config_str()}
  finally:
    gin.clear_config()


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Trains and decodes each recipe; writes ``OUT/<recipe>.npz`` and ``OUT/run.json``."""
  refuse_imports()
  import jax

  from meshbayes.evaluation import token_arrays
  from meshbayes.partitioning import Partitioner
  from meshbayes.training import array_training

  arrays, meta = load_arrays(Path(args.arrays))
  lengths = meta["feature_lengths"]
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])
  report = {"arrays": meta, "device_kind": jax.devices()[0].device_kind,
            "jax_version": jax.__version__, "num_samples": args.num_samples,
            "beam_size": args.beam_size, "bindings": args.binding, "recipes": {}}
  for name in args.recipes:
    setup = recipe(name, meta, args.binding)
    print(f"run: {name}: training (at most {args.train_steps} steps, "
          f"{args.train_seconds:.0f} s)", flush=True)
    trained = array_training.train(setup, arrays, lengths, partitioner, args.train_steps,
                                   args.train_seconds, args.steps_per_call)
    log, params = trained.log, trained.state.params
    print(f"run: {name}: {log['steps']} steps ({log['epochs']:.2f} epochs) in "
          f"{log['seconds']:.0f} s, loss {log['chunks'][-1]['loss']:.3f}; decoding", flush=True)
    began = time.perf_counter()
    log["validation"] = array_training.validation(trained.steps, params, arrays, lengths,
                                                  partitioner, args.eval_batch_size)
    outputs = token_arrays.predict(trained.steps.model, params, arrays, meta, partitioner,
                                   args.num_samples, args.beam_size, args.eval_batch_size)
    log["eval_seconds"] = time.perf_counter() - began
    log["num_params"] = int(sum(x.size for x in jax.tree.leaves(params)))
    log["config"] = setup["config"]
    np.savez_compressed(out / f"{name}.npz", **outputs)
    report["recipes"][name] = log
    text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=1)
    (out / "run.json").write_text(text + "\n")  # what a cut run keeps
    print(f"run: {name}: validation NLL {log['validation']['nll']:.3f}; decoded in "
          f"{log['eval_seconds']:.0f} s; {out / name}.npz", flush=True)
  return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The subcommand and its arguments, checked (a bad one: argparse's one line, status 2)."""
  parser = argparse.ArgumentParser(prog="gpu_sequence_run", description=__doc__.split("\n")[0])
  commands = parser.add_subparsers(dest="command", required=True)
  exporting = commands.add_parser("export", help="write a task's splits as token-id arrays")
  exporting.add_argument("--task", default="tatoeba_enfr")
  exporting.add_argument("--out", default="runs/gpu_arrays/tatoeba_enfr.npz")
  running = commands.add_parser("run", help="train and decode each recipe (the GPU side)")
  running.add_argument("--arrays", required=True, help="the export's .npz")
  running.add_argument("--out", required=True, help="folder of <recipe>.npz and run.json")
  running.add_argument("--recipes", default=",".join(RECIPES),
                       help=f"comma-separated, from {', '.join(RECIPES)}")
  running.add_argument("--train_steps", type=int, default=100_000,
                       help="most steps per recipe")
  running.add_argument("--train_seconds", type=float, default=100.0,
                       help="most seconds of training per recipe, compilation included "
                            "(the validation pass and decoding come after)")
  running.add_argument("--steps_per_call", type=int, default=200,
                       help="train steps per device call (a lax.scan)")
  running.add_argument("--num_samples", type=int, default=None,
                       help="weight samples of the model average (default: the evaluation's)")
  running.add_argument("--beam_size", type=int, default=None,
                       help="beams (default: the evaluation's)")
  running.add_argument("--eval_batch_size", type=int, default=250,
                       help="sources per decoding batch")
  running.add_argument("--binding", action="append", default=[],
                       help="a gin binding after the recipe's (repeatable), e.g. "
                            "models.TransformerConfig.emb_dim=256")
  scoring = commands.add_parser("score", help="figures and a markdown table of run's outputs")
  scoring.add_argument("--arrays", required=True, help="the export's .npz")
  scoring.add_argument("--outputs", required=True, help="the run's folder (its OUT)")
  scoring.add_argument("--bootstrap_resamples", type=int, default=None,
                       help="resamples of each interval (default: the evaluation's)")
  scoring.add_argument("--markdown", default=None, help="also write the table here")
  scoring.add_argument("--json", default=None, help="every figure with its interval, as JSON")
  args = parser.parse_args(argv)
  if args.command == "run":
    _check_run_args(parser, args)
  if args.command == "score":
    from meshbayes.evaluation.settings import ReportConfig

    if args.bootstrap_resamples is None:
      args.bootstrap_resamples = ReportConfig().bootstrap_resamples
    if args.bootstrap_resamples < 1:
      parser.error(f"--bootstrap_resamples={args.bootstrap_resamples}: give at least 1")
  return args


def _check_run_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """``run``'s arguments checked, the defaults filled in from the evaluation's settings."""
  from meshbayes.evaluation.settings import DecodeConfig, PredictiveConfig

  args.recipes = args.recipes.split(",")
  unknown = [r for r in args.recipes if r not in RECIPES]
  if unknown or not args.recipes:
    parser.error(f"--recipes={','.join(args.recipes)}: choose from {', '.join(RECIPES)}")
  if args.num_samples is None:
    args.num_samples = PredictiveConfig().num_samples
  if args.beam_size is None:
    args.beam_size = DecodeConfig().beam_size
  for name in ("train_steps", "steps_per_call", "num_samples", "beam_size", "eval_batch_size"):
    if getattr(args, name) < 1:
      parser.error(f"--{name}={getattr(args, name)}: give a positive int")
  if not args.train_seconds > 0:
    parser.error(f"--train_seconds={args.train_seconds}: give a positive number")


def main(argv: Sequence[str] | None = None) -> Any:
  args = parse_args(argv)
  if args.command == "run":
    return run(args)  # first, before any import of the evaluation's: see refuse_imports
  from meshbayes.evaluation import items, token_arrays

  if args.command == "export":
    meta = token_arrays.export(args.task, task_lengths(args.task), Path(args.out))
    print(strict_json.dumps(meta, indent=1))
    print(f"export: {args.out}, {meta['bytes'] / 2**20:.1f} MiB")
    return meta
  arrays, meta = load_arrays(Path(args.arrays))
  figures = token_arrays.score(arrays, meta, Path(args.outputs), args.bootstrap_resamples,
                               RECIPES)
  table = token_arrays.markdown(figures)
  print(table, end="")
  if args.markdown:
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(table)
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(strict_json.dumps(
        items.as_json(figures), null_reasons=strict_json.NULL_REASONS, indent=1) + "\n")
  return figures


if __name__ == "__main__":
  main()
