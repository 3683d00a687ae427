"""Measure the ELBO gradient's variance over weight-noise draws, estimator by estimator.

For one batch of a training recipe (default ``uncertainty/bayesian.gin``, the CPU
experiment's Bayesian model; 32 examples drawn from its training split when ``make data``
ran, else a synthetic batch) and one set of parameters (at initialization, or a run's
newest checkpoint), the gradient under ``--num_draws`` weight-noise keys, the dropout
masks held fixed, for: the posterior mean (deterministic: no variance), the paper's
estimators (Flipout attention, local reparameterization feed-forward: the recipe as
configured), reparameterization (k = 1) and the grouped reparameterization at each
``--group_counts`` k. Per kind of parameter: the mean per-element variance, the
signal-to-noise ratio, ``k Var(k) / Var(1)`` (1 under the 1/k law) and the variance
relative to the paper's. Prints a markdown table; ``--json`` writes every figure, per
parameter group too (``meshbayes.training.gradient_variance``).

  python -m meshbayes.tools.gradient_variance                   # batch 32, 64 draws
  python -m meshbayes.tools.gradient_variance --checkpoint_dir=runs/x --json=gv.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.runtime import strict_json
from meshbayes.training import gradient_variance


def synthetic_batch(batch_size: int, lengths: Mapping[str, int], seed: int = 0
                    ) -> dict[str, np.ndarray]:
  """A batch of the synthetic reverse task's kind without its pipeline: ids in ``[2, 32)``,
  4 to 12 of them (fewer if ``lengths`` are shorter) then EOS (1), targets reversed."""
  from meshbayes.data import arrays

  longest = min(lengths["inputs"], lengths["targets"]) - 1
  if longest < 1:
    raise ValueError(f"synthetic_batch: lengths={dict(lengths)!r} leave no room for a token "
                     "before EOS; use lengths of 2 or more")
  rng = np.random.default_rng(seed)
  inputs = np.zeros((batch_size, lengths["inputs"]), np.int32)
  targets = np.zeros((batch_size, lengths["targets"]), np.int32)
  for row, size in enumerate(rng.integers(min(4, longest), min(12, longest) + 1,
                                          size=batch_size)):
    ids = rng.integers(2, 32, size=size)
    inputs[row, :size + 1] = np.append(ids, 1)
    targets[row, :size + 1] = np.append(ids[::-1], 1)
  return arrays.features(inputs, targets)


def _prepared(task: str) -> bool:
  """Whether ``task``'s data is there: a Tatoeba task needs ``make data``'s corpus."""
  if not task.startswith("tatoeba"):
    return True
  from meshbayes.data import paths, tatoeba

  return tatoeba.read_manifest(paths.data_dir()) is not None


# The examples a task batch is drawn from: the first POOL_BATCHES batches of the split.
POOL_BATCHES = 64


def _task_batch(task: str, lengths: Mapping[str, int], batch_size: int,
                seed: int) -> dict[str, np.ndarray]:
  """``batch_size`` examples drawn at random (``seed``) from the first ``POOL_BATCHES``
  batches of ``task``'s training split (read as the evaluation reads a split: truncated,
  EOS kept). Not the first examples: neighbours in the file are often translations of one
  sentence, and groups of near-duplicates would share their gradient noise."""
  from meshbayes.data.pipeline import TaskData
  from meshbayes.partitioning import DataLayout

  data = TaskData(task, dict(lengths), batch_size, shuffle=False)
  pool: dict[str, list[np.ndarray]] = {}
  for index, batch in enumerate(data.eval_batches(DataLayout(batch_size), "train")):
    if index == POOL_BATCHES:
      break
    for name, value in batch.items():
      pool.setdefault(name, []).append(np.asarray(value))
  examples = {name: np.concatenate(values) for name, values in pool.items()}
  count = len(next(iter(examples.values())))
  chosen = np.random.default_rng(seed).choice(count, size=min(batch_size, count), replace=False)
  return {name: value[chosen] for name, value in examples.items()}


def _parse_gin(files: Sequence[Path], bindings: Sequence[str]) -> None:
  import gin

  import meshbayes.configurables  # noqa: F401  (the names the presets bind)
  from meshbayes.gin_configs import DIRECTORY
  from meshbayes.runtime import gin_preflight

  gin.clear_config()
  gin.add_config_file_search_path(str(DIRECTORY))
  gin_preflight.safe_existence_checks()
  with gin_preflight.quiet_search_misses():
    gin.parse_config_files_and_bindings([str(f) for f in files], list(bindings))


DATA = ("auto", "task", "synthetic")


def load_setup(gin_file: str, bindings: Sequence[str] = (), preset: str | None = None,
               batch_size: int | None = None, data: str = "auto",
               checkpoint_dir: str | None = None, say: Callable[[str], None] = lambda line: None
               ) -> dict[str, Any]:
  """The model, parameters, batch and KL weight of a training configuration.

  Args:
    gin_file: a training recipe (``uncertainty/bayesian.gin``: a path, or one under
      ``meshbayes/gin_configs``).
    bindings: gin bindings after it (``models.TransformerConfig.emb_dim = 16``).
    preset: a size preset of ``gin_configs/models/`` included after the recipe (its
      model with the recipe's vocabulary; the recipe's data, batch, KL weight and divisor).
    batch_size: examples in the batch (None: the recipe's ``BATCH_SIZE``).
    data: ``task``, examples of the recipe's training split (``_task_batch``); ``synthetic``,
      a synthetic reverse batch (``synthetic_batch``); ``auto``, the task's if its data
      is prepared (``make data``), else synthetic (the KL divisor then the synthetic
      task's).
    checkpoint_dir: a run of this model whose newest checkpoint's parameters to take
      (None: the parameters at initialization, from the recipe's seed).

  Returns:
    ``model``, ``params`` (unboxed), ``batch``, ``kl_weight`` (the KL weight's final
    value), ``seed``, and ``description`` (what was used, for the report).
  """
  import gin

  from meshbayes.gin_configs import DIRECTORY

  if data not in DATA:
    raise ValueError(f"--data={data}: choose from {', '.join(DATA)}")
  path = Path(gin_file) if Path(gin_file).exists() else DIRECTORY / gin_file
  if not path.exists():
    raise ValueError(f"--gin_file={gin_file}: no such file here or under {DIRECTORY}")
  files = [path] + ([DIRECTORY / "models" / f"{preset}.gin"] if preset else [])
  if preset and not files[-1].exists():
    raise ValueError(f"--preset={preset}: no {files[-1]}")
  given = ["MODEL_DIR = 'unused'", "TRAIN_STEPS = 1"]  # the trainer's, never called here
  try:
    _parse_gin(files[:1], [*given, *bindings])
    task = gin.query_parameter("%MIXTURE_OR_TASK_NAME")
    synthetic = data == "synthetic" or (data == "auto" and not _prepared(task))
    if synthetic and data == "auto":
      say(f"the data of task {task!r} is not prepared (make data): a synthetic batch")
      given.append("MIXTURE_OR_TASK_NAME = 'synthetic_reverse'")
    if preset:  # the preset's model with the recipe's vocabulary, its data's
      given.append("models.TransformerConfig.vocab_size = "
                   f"{gin.query_parameter('models.TransformerConfig.vocab_size')}")
    _parse_gin(files, [*given, *bindings])
    lengths = dict(gin.query_parameter("%TASK_FEATURE_LENGTHS"))
    batch_size = batch_size or int(gin.query_parameter("%BATCH_SIZE"))
    seed = int(gin.query_parameter("%SEED"))
    model = gin.get_configurable("models.EncoderDecoderModel")()
    kl_weight = float(gin.get_configurable("optimizers.KLWeight")().value)
  finally:
    gin.clear_config()
  if batch_size < 1:
    raise ValueError(f"--batch_size={batch_size}: must be a positive int")
  batch = (synthetic_batch(batch_size, lengths, seed) if synthetic
           else _task_batch(task, lengths, batch_size, seed))
  batch = {name: jnp.asarray(value) for name, value in batch.items()}
  shapes = {name: value.shape for name, value in batch.items()}
  if checkpoint_dir is None:
    params = jax.jit(lambda key: nn.unbox(model.get_initial_variables(key, shapes)["params"]))(
        jax.random.key(seed))
    origin = "initialization"
  else:
    params, step = _restored(model, checkpoint_dir, task, lengths, batch_size)
    origin = f"{checkpoint_dir} step {step}"
  return {"model": model, "params": params, "batch": batch, "kl_weight": kl_weight,
          "seed": seed, "description": {
              "gin_file": str(gin_file), "preset": preset, "bindings": list(bindings),
              "data": "synthetic_reverse" if synthetic else task, "batch_size": batch_size,
              "feature_lengths": lengths, "params": origin, "kl_weight": kl_weight,
              "num_train_units": model.num_train_units,
              "estimators": dataclasses.asdict(model.config.estimators)}}


def _restored(model: Any, checkpoint_dir: str, task: str, lengths: Mapping[str, int],
              batch_size: int) -> tuple[Any, int]:
  """A run's newest parameters, on this host's first device."""
  from meshbayes.data.pipeline import TaskData
  from meshbayes.partitioning import Partitioner
  from meshbayes.training.checkpoint_restore import restore_params

  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])
  params, step = restore_params(checkpoint_dir, model, TaskData(task, dict(lengths), batch_size),
                                partitioner)
  if not isinstance(params, Mapping):
    raise ValueError(f"--checkpoint_dir={checkpoint_dir}: the run holds a posterior of its "
                     f"own ({type(params).__name__}), not Bayesian layers' parameters")
  return nn.unbox(params), step


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="gradient_variance",
                                   description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--gin_file", default="uncertainty/bayesian.gin",
                      help="the training recipe (a path, or one under meshbayes/gin_configs)")
  parser.add_argument("--preset", default=None,
                      help="a model size preset (gin_configs/models/NAME.gin) included after "
                           "the recipe")
  parser.add_argument("--binding", action="append", default=[],
                      help="a gin binding after the recipe's (repeatable), e.g. "
                           "models.TransformerConfig.emb_dim=16")
  parser.add_argument("--checkpoint_dir", default=None,
                      help="a run of this model: its newest parameters (default: at "
                           "initialization)")
  parser.add_argument("--batch_size", type=int, default=None,
                      help="examples in the batch (default: the recipe's BATCH_SIZE)")
  parser.add_argument("--data", default="auto", choices=DATA,
                      help="the recipe's task (auto: if its data is prepared) or a synthetic "
                           "batch")
  parser.add_argument("--group_counts", default="4,8,32",
                      help="the grouped estimator's k values, each a divisor of the batch")
  parser.add_argument("--num_draws", type=int, default=64,
                      help="weight-noise draws per estimator (at least 2)")
  parser.add_argument("--seed", type=int, default=0, help="seed of the draws and dropout")
  parser.add_argument("--json", default=None, help="also write every figure here")
  parser.add_argument("--markdown", default=None, help="also write the table here")
  args = parser.parse_args(argv)
  try:
    args.group_counts = [int(k) for k in args.group_counts.split(",")]
  except ValueError:
    parser.error(f"--group_counts={args.group_counts}: give comma-separated ints, e.g. 4,8,32")
  if args.num_draws < 2:
    parser.error(f"--num_draws={args.num_draws}: a variance needs at least 2 draws")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  say = lambda line: print(f"gradient_variance: {line}", file=sys.stderr, flush=True)
  try:
    setup = load_setup(
        args.gin_file, args.binding, args.preset, args.batch_size, args.data,
        args.checkpoint_dir, say)
    results = gradient_variance.compare_estimators(
        setup["model"], setup["params"], setup["batch"], setup["kl_weight"],
        args.group_counts, args.num_draws, args.seed, say)
  except ValueError as error:
    raise SystemExit(f"gradient_variance: error: {error}") from None
  report = {"setup": {**setup["description"], "num_draws": args.num_draws, "seed": args.seed},
            "rows": results}
  table = gradient_variance.markdown(results)
  print(table, end="")
  if args.markdown:
    Path(args.markdown).write_text(table)
  if args.json:
    Path(args.json).write_text(strict_json.dumps(
        report, null_reasons=strict_json.NULL_REASONS, indent=1) + "\n")
  return report


if __name__ == "__main__":
  main()
