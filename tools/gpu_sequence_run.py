"""Sequence calibration with enough positives: the deterministic and Bayesian-layer
translation recipes trained on the full Tatoeba corpus on a lent GPU, decoded there, scored here.

On the 20k-pair subset only 1-4% of decoded test outputs match a reference, far below the
~400 positives a sequence ECE needs (docs/uncertainty.md, "The measures"). Three steps:

- ``export`` (here, with seqio): a task's train, validation and test splits as the
  evaluation reads them (EOS included, truncated to the task's lengths), uint16 token ids
  trimmed of empty columns, and the test split grouped by source (each source's references
  as token ids, ``evaluation.sources.group_sources``), into one compressed ``.npz``.
- ``run`` (on the GPU; neither seqio nor TensorFlow is imported, and an import of either
  fails): each recipe of ``gin_configs/uncertainty/`` (its model, optimizer, KL weight,
  batch and seed; the vocabulary size and KL divisor from the export) trained with the
  trainer's own step (``training.train_step``) for ``--train_steps`` or ``--train_seconds``,
  whichever ends first; then each predictive (the deterministic model; the Bayesian model
  average of S weight samples and its posterior mean) decodes every test source by beam
  search (``evaluation.predictives.decode_and_score``) and gives its teacher-forced token
  statistics of every test pair (``predictives.token_calibration``). Writes
  ``OUT/<recipe>.npz`` (outputs, log-probabilities, per-token log-probabilities,
  uncertainty measures, token statistics) and ``OUT/run.json`` (steps, losses, seconds).
- ``score`` (here): the outputs detokenized with the task's vocabulary and every figure of
  ``evaluation.items`` with bootstrap intervals over sources: BLEU, exact match and its
  positives, sequence ECE with its null band, reference-fraction ECE, decoded-token ECE,
  calibration AUROC; a markdown table (and ``--json``).

  python -m meshbayes.tools.gpu_sequence_run export --task=tatoeba_enfr --out=runs/gpu_arrays/tatoeba_enfr.npz
  PYTHONPATH=/tmp/site JAX_PLATFORMS=cuda python -m meshbayes.tools.gpu_sequence_run run \\
    --arrays=runs/gpu_arrays/tatoeba_enfr.npz --out=$OUT --train_seconds=100
  python -m meshbayes.tools.gpu_sequence_run score --arrays=runs/gpu_arrays/tatoeba_enfr.npz \\
    --outputs=OUT --markdown=runs/gpu_sequence/table.md

The whole device sequence (wheels, carry, time budget): docs/experiment.md, "On a GPU:
sequence calibration with positives".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshbayes.runtime import strict_json

RECIPES = ("deterministic", "bayesian")
SPLITS = ("train", "validation", "test")
FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
            "decoder_loss_weights")
# Never imported by ``run``: the lent GPU has neither.
REFUSED_MODULES = ("seqio", "tensorflow")
# Columns of the table: (figure of evaluation.items, heading, scale, format).
COLUMNS = (("bleu", "BLEU", 1.0, ".2f"), ("exact_match", "exact match %", 100.0, ".2f"),
           ("sequence_ece", "sequence ECE %", 100.0, ".2f"),
           ("fraction_ece", "reference-fraction ECE %", 100.0, ".2f"),
           ("decoded_token_ece", "decoded-token ECE %", 100.0, ".2f"),
           ("calibration_auroc", "calibration AUROC", 1.0, ".3f"),
           ("token_ece", "token ECE % (teacher-forced)", 100.0, ".2f"))


# --------------------------------------------------------------------------- export


def split_arrays(task: str, lengths: dict[str, int], split: str, batch_size: int = 1024
                 ) -> tuple[np.ndarray, np.ndarray]:
  """``(pairs, L_in)`` inputs and ``(pairs, L_out)`` targets of a split as the evaluation
  reads it (``TaskData.eval_batches``: in order, EOS included, truncated), padding rows
  dropped."""
  from meshbayes.data import TaskData
  from meshbayes.partitioning import DataLayout

  data = TaskData(task, lengths, batch_size, shuffle=False)
  batches = list(data.eval_batches(DataLayout(batch_size), split))
  inputs = np.concatenate([b["encoder_input_tokens"] for b in batches])
  targets = np.concatenate([b["decoder_target_tokens"] for b in batches])
  present = inputs.any(-1)
  return inputs[present], targets[present]


def compact(ids: np.ndarray) -> np.ndarray:
  """``ids`` as uint16 without the trailing all-zero columns (at least one column kept)."""
  if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.uint16).max):
    raise ValueError(f"token ids from {ids.min()} to {ids.max()} do not fit uint16")
  used = np.flatnonzero(ids.any(0))
  return ids[:, :max(1, used[-1] + 1 if used.size else 1)].astype(np.uint16)


def padded(ids: np.ndarray, length: int) -> np.ndarray:
  """uint16 ``ids`` back as int32 of ``length`` columns (zeros after)."""
  return np.pad(ids.astype(np.int32), [(0, 0), (0, length - ids.shape[1])])


def export(task: str, out: Path) -> dict[str, Any]:
  """Writes ``task``'s splits (at the lengths of ``gin_configs/tasks/<task>.gin``) and its
  test sources to ``out`` (``.npz``); returns the meta."""
  from meshbayes.data.pipeline import get_task

  lengths = task_lengths(task)
  vocabulary = get_task(task).output_features["targets"].vocabulary
  arrays, meta = {}, {"task": task, "feature_lengths": lengths, "eos_id": vocabulary.eos_id,
                      "vocab_size": vocabulary.vocab_size}
  for split in SPLITS:
    inputs, targets = split_arrays(task, lengths, split)
    arrays[f"{split}_inputs"], arrays[f"{split}_targets"] = compact(inputs), compact(targets)
    meta[f"{split}_pairs"] = len(inputs)
  # The KL's divisor D: the training split's target tokens (data.train_set_size's 'tokens').
  meta["num_train_units"] = int((arrays["train_targets"] > 0).sum())
  arrays.update(source_arrays(task, padded(arrays["test_inputs"], lengths["inputs"]),
                              padded(arrays["test_targets"], lengths["targets"])))
  meta.update(test_sources=len(arrays["test_source_inputs"]),
              test_references=len(arrays["test_reference_ids"]))
  out.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(out, meta=np.array(strict_json.dumps(meta)), **arrays)
  meta["bytes"] = out.stat().st_size
  return meta


def source_arrays(task: str, inputs: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
  """The pairs grouped by source as the evaluation groups them (``group_sources``): each
  distinct source's input, each pair's source, each distinct reference's ids and source."""
  from meshbayes.data.pipeline import get_task
  from meshbayes.evaluation.sources import group_sources

  vocabularies = get_task(task).output_features
  sources = group_sources([{"encoder_input_tokens": inputs, "decoder_target_tokens": targets}],
                          vocabularies["inputs"].vocabulary, vocabularies["targets"].vocabulary)
  references = [ids for per_source in sources.reference_ids for ids in per_source]
  reference_ids = np.zeros((len(references), targets.shape[1]), np.int64)
  for row, ids in enumerate(references):
    reference_ids[row, :len(ids)] = ids
  return {"test_source_inputs": compact(sources.inputs),
          "test_row_source": sources.row_source.astype(np.int32),
          "test_reference_ids": compact(reference_ids),
          "test_reference_source": np.repeat(np.arange(len(sources.texts), dtype=np.int32),
                                             [len(r) for r in sources.reference_ids])}


def task_lengths(task: str) -> dict[str, int]:
  """``TASK_FEATURE_LENGTHS`` of ``gin_configs/tasks/<task>.gin``."""
  import gin

  from meshbayes.gin_configs import DIRECTORY

  path = DIRECTORY / "tasks" / f"{task}.gin"
  if not path.exists():
    raise ValueError(f"--task={task}: no {path} to take its feature lengths from")
  try:
    parse_gin(path, [])
    return dict(gin.query_parameter("%TASK_FEATURE_LENGTHS"))
  finally:
    gin.clear_config()


def parse_gin(path: Path, bindings: Sequence[str]) -> None:
  """Parses ``path`` and ``bindings`` into a cleared gin configuration, includes searched for
  in the presets (and a ``runs/`` folder in the working directory not taken for a package)."""
  import gin

  import meshbayes.configurables  # noqa: F401  (the names the presets bind)
  from meshbayes.gin_configs import DIRECTORY
  from meshbayes.runtime import gin_preflight

  gin.clear_config()
  gin.add_config_file_search_path(str(DIRECTORY))
  gin_preflight.safe_existence_checks()  # as launch does
  with gin_preflight.quiet_search_misses():
    gin.parse_config_files_and_bindings([str(path)], list(bindings))


def load_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """The arrays and meta ``export`` wrote to ``path``."""
  if not path.is_file():
    raise ValueError(f"--arrays={path}: no such file (write it with the export subcommand)")
  with np.load(path) as stored:
    if "meta" not in stored.files:
      raise ValueError(f"--arrays={path}: not an export of this tool (no meta)")
    return {k: stored[k] for k in stored.files if k != "meta"}, json.loads(str(stored["meta"]))


# --------------------------------------------------------------------------- run


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


def features(inputs: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
  """The encoder-decoder batch of int32 ``inputs`` and ``targets`` (seqio's
  ``EncDecFeatureConverter`` without packing: targets shifted right, weights on tokens)."""
  return {"encoder_input_tokens": inputs, "decoder_target_tokens": targets,
          "decoder_input_tokens": np.pad(targets[..., :-1], [(0, 0)] * (targets.ndim - 1)
                                         + [(1, 0)]),
          "decoder_loss_weights": (targets > 0).astype(np.int32)}


def recipe(name: str, meta: dict[str, Any], bindings: Sequence[str]) -> dict[str, Any]:
  """The recipe ``gin_configs/uncertainty/<name>.gin`` with the export's vocabulary size,
  lengths and KL divisor, and ``bindings``: its model, optimizer, KL weight, batch size, seed."""
  import gin

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


def batch_indices(num_rows: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
  """Rows of each training batch: a fresh permutation each epoch, the remainder dropped."""
  if num_rows < batch_size:
    raise ValueError(f"run: {num_rows} training pairs are fewer than a batch of {batch_size}")
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(num_rows)
    for start in range(0, num_rows - batch_size + 1, batch_size):
      yield order[start:start + batch_size]


def train(setup: dict[str, Any], arrays: dict[str, np.ndarray], lengths: dict[str, int],
          partitioner: Any, train_steps: int, train_seconds: float, steps_per_call: int
          ) -> tuple[Any, Any, dict[str, Any]]:
  """Trains the recipe with the trainer's step (``StepFunctions``), ``steps_per_call`` steps
  per device call, until ``train_steps`` or ``train_seconds`` (compilation included).

  Returns:
    ``(steps, final state, log)``.
  """
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  from meshbayes.training.train_step import StepFunctions, all_finite, init_train_state

  model, batch_size = setup["model"], setup["batch_size"]
  steps = StepFunctions.build(model, setup["optimizer"], setup["kl_weight"], setup["seed"])
  shapes = {name: (batch_size, lengths["inputs" if name.startswith("encoder") else "targets"])
            for name in FEATURES}
  state, _ = partitioner.init(lambda k: init_train_state(model, steps.optimizer, shapes, k),
                              jax.random.key(setup["seed"]))
  replicated = NamedSharding(partitioner.mesh, PartitionSpec())
  data = jax.device_put(features(padded(arrays["train_inputs"], lengths["inputs"]),
                                 padded(arrays["train_targets"], lengths["targets"])), replicated)

  def chunk(state, data, rows):
    def body(state, index):
      state, metrics = steps.train_step(state, {k: v[index] for k, v in data.items()})
      return state, metrics["loss"]
    return jax.lax.scan(body, state, rows)

  run_chunk = jax.jit(chunk, donate_argnums=(0,))
  order = batch_indices(len(arrays["train_inputs"]), batch_size, setup["seed"])
  log: dict[str, Any] = {"batch_size": batch_size, "chunks": []}
  started, done = time.perf_counter(), 0
  with partitioner.activation_rules():
    while done < train_steps and time.perf_counter() - started < train_seconds:
      count = min(steps_per_call, train_steps - done)
      rows = np.stack([next(order) for _ in range(count)]).astype(np.int32)
      state, losses = run_chunk(state, data, rows)
      losses = np.asarray(jax.device_get(losses))
      done += count
      if not np.all(np.isfinite(losses)):
        raise FloatingPointError(f"run: non-finite loss by step {done}")
      log["chunks"].append({"step": done, "loss": float(losses.mean()),
                            "seconds": time.perf_counter() - started})
    if not bool(all_finite((state.params, state.opt_state))):
      raise FloatingPointError(f"run: non-finite parameters after step {done}")
  log.update(steps=done, seconds=time.perf_counter() - started,
             epochs=done * batch_size / len(arrays["train_inputs"]))
  return steps, state, log


def validation(steps: Any, params: Any, arrays: dict[str, np.ndarray], lengths: dict[str, int],
               partitioner: Any, batch_size: int) -> dict[str, float]:
  """The trainer's validation pass (``steps.eval_step``, the posterior mean's) over the
  validation split: its teacher-forced NLL and accuracy per token."""
  import jax

  from meshbayes.training.teacher_forced import teacher_forced_metrics

  pairs = features(padded(arrays["validation_inputs"], lengths["inputs"]),
                   padded(arrays["validation_targets"], lengths["targets"]))
  return teacher_forced_metrics(jax.jit(steps.eval_step), params,
                                in_batches(pairs, batch_size), partitioner)


def in_batches(arrays: dict[str, np.ndarray], batch_size: int) -> list[dict[str, np.ndarray]]:
  """Feature batches of ``batch_size`` rows, the last padded with empty rows (as
  ``TaskData.eval_batches``)."""
  from meshbayes.data.text_lines import in_batches as rows_in_batches

  names = list(arrays)
  return [dict(zip(names, parts)) for parts in zip(
      *(rows_in_batches(arrays[name], batch_size) for name in names))]


def predict(model: Any, params: Any, arrays: dict[str, np.ndarray], meta: dict[str, Any],
            partitioner: Any, num_samples: int, beam_size: int, batch_size: int
            ) -> dict[str, np.ndarray]:
  """Each predictive's decoded test sources and teacher-forced statistics of the test pairs,
  as ``evaluate`` computes them, as named arrays (``<predictive>/...``)."""
  import jax

  from meshbayes.data.text_lines import in_batches as rows_in_batches
  from meshbayes.evaluation import predictives
  from meshbayes.evaluation.settings import PredictiveConfig

  lengths = meta["feature_lengths"]
  pairs = features(padded(arrays["test_inputs"], lengths["inputs"]),
                   padded(arrays["test_targets"], lengths["targets"]))
  sources = padded(arrays["test_source_inputs"], lengths["inputs"])
  rng = jax.random.key(PredictiveConfig().seed)
  result = {}
  for variant in predictives.predictives(model.is_bayesian, num_samples):
    _, per_row = predictives.token_calibration(model, params, in_batches(pairs, batch_size),
                                               partitioner, variant, rng)
    records = predictives.decode_and_score(
        model, params, rows_in_batches(sources, batch_size),
        partitioner, variant, rng, max_length=lengths["targets"], eos_id=meta["eos_id"],
        method="beam", beam_size=beam_size)
    result.update(as_arrays(variant.name, records, lengths["targets"]))
    result.update({f"{variant.name}/token_statistic/{k}": v[:len(arrays["test_inputs"])]
                   for k, v in per_row.items()})
  return result


def as_arrays(name: str, records: Sequence[Any], length: int) -> dict[str, np.ndarray]:
  """``predictives.Decoded`` records as arrays under ``name/``."""
  outputs = np.zeros((len(records), length), np.int64)
  token_log_probs = np.zeros((len(records), length + 1), np.float32)
  for row, record in enumerate(records):
    outputs[row, :len(record.output_ids)] = record.output_ids
    token_log_probs[row, :len(record.token_log_probs)] = record.token_log_probs
  result = {f"{name}/output_ids": compact(outputs), f"{name}/token_log_probs": token_log_probs,
            f"{name}/log_prob": np.array([r.log_prob for r in records]),
            f"{name}/num_tokens": np.array([r.num_tokens for r in records], np.int32)}
  result.update({f"{name}/measure/{m}": np.array([r.measures[m] for r in records])
                 for m in records[0].measures})
  return result


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Trains and decodes each recipe; writes ``OUT/<recipe>.npz`` and ``OUT/run.json``."""
  refuse_imports()
  import jax

  from meshbayes.partitioning import Partitioner

  arrays, meta = load_arrays(Path(args.arrays))
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
    steps, state, log = train(setup, arrays, meta["feature_lengths"], partitioner,
                              args.train_steps, args.train_seconds, args.steps_per_call)
    print(f"run: {name}: {log['steps']} steps ({log['epochs']:.2f} epochs) in "
          f"{log['seconds']:.0f} s, loss {log['chunks'][-1]['loss']:.3f}; decoding", flush=True)
    began = time.perf_counter()
    log["validation"] = validation(steps, state.params, arrays, meta["feature_lengths"],
                                   partitioner, args.eval_batch_size)
    outputs = predict(steps.model, state.params, arrays, meta, partitioner, args.num_samples,
                      args.beam_size, args.eval_batch_size)
    log["eval_seconds"] = time.perf_counter() - began
    log["num_params"] = int(sum(x.size for x in jax.tree.leaves(state.params)))
    log["config"] = setup["config"]
    np.savez_compressed(out / f"{name}.npz", **outputs)
    report["recipes"][name] = log
    text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=1)
    (out / "run.json").write_text(text + "\n")  # what a cut run keeps
    print(f"run: {name}: validation NLL {log['validation']['nll']:.3f}; decoded in "
          f"{log['eval_seconds']:.0f} s; {out / name}.npz", flush=True)
  return report


# --------------------------------------------------------------------------- score


def split_sources(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Any:
  """The test split's sources (``evaluation.sources.Sources``), detokenized with the task's
  vocabularies."""
  from meshbayes.data.pipeline import get_task
  from meshbayes.evaluation.sources import Sources

  vocabularies = get_task(meta["task"]).output_features
  source_vocabulary, vocabulary = (vocabularies[k].vocabulary for k in ("inputs", "targets"))
  inputs = padded(arrays["test_source_inputs"], meta["feature_lengths"]["inputs"])
  reference_ids: list[list[tuple[int, ...]]] = [[] for _ in inputs]
  for source, ids in zip(arrays["test_reference_source"], arrays["test_reference_ids"]):
    reference_ids[source].append(tuple(int(i) for i in ids if i > 0))
  return Sources(inputs, [source_vocabulary.decode([int(i) for i in row if i > 0])
                          for row in inputs],
                 [[vocabulary.decode(list(ids)) for ids in refs] for refs in reference_ids],
                 arrays["test_row_source"].astype(np.int64), reference_ids)


def decoded_records(outputs: dict[str, np.ndarray], name: str) -> list[Any]:
  """The ``predictives.Decoded`` records ``as_arrays`` stored under ``name/``."""
  from meshbayes.evaluation.predictives import Decoded

  measures = {k.split("/", 2)[2]: v for k, v in outputs.items()
              if k.startswith(f"{name}/measure/")}
  records = []
  for row, ids in enumerate(outputs[f"{name}/output_ids"]):
    count = int(outputs[f"{name}/num_tokens"][row])
    row_measures = {m: float(v[row]) for m, v in measures.items()}
    records.append(Decoded(
        tuple(int(i) for i in ids if i > 0), float(outputs[f"{name}/log_prob"][row]), count,
        row_measures["total_uncertainty"], row_measures.get("mutual_information", 0.0),
        row_measures, tuple(map(float, outputs[f"{name}/token_log_probs"][row, :count]))))
  return records


def score(arrays: dict[str, np.ndarray], meta: dict[str, Any], outputs_dir: Path,
          resamples: int) -> dict[str, dict[str, Any]]:
  """Every figure of each recipe's predictives (``evaluation.items.intervals``), keyed
  ``<recipe>/<predictive>``."""
  from meshbayes.data import TaskData
  from meshbayes import metrics
  from meshbayes.evaluation import driver, items

  data = TaskData(meta["task"], meta["feature_lengths"], batch_size=1)
  sources = split_sources(arrays, meta)
  found = [name for name in RECIPES if (outputs_dir / f"{name}.npz").exists()]
  if not found:
    raise ValueError(f"--outputs={outputs_dir}: no {' or '.join(f'{n}.npz' for n in RECIPES)}")
  figures = {}
  for name in found:
    with np.load(outputs_dir / f"{name}.npz") as stored:
      outputs = {k: stored[k] for k in stored.files}
    for predictive in dict.fromkeys(k.split("/")[0] for k in outputs):  # the headline first
      statistics = {k.split("/", 2)[2]: v for k, v in outputs.items()
                    if k.startswith(f"{predictive}/token_statistic/")}
      # The evaluation's own items (driver._source_items), so every figure is its figure.
      source_items = driver._source_items(  # pylint: disable=protected-access
          data, sources, sources.sum_rows(statistics), decoded_records(outputs, predictive),
          metrics.DEFAULT_NUM_BINS)
      figures[f"{name}/{predictive}"] = items.intervals(source_items, resamples)
  return figures


def markdown(figures: dict[str, dict[str, Any]]) -> str:
  """One row per predictive: each column's estimate with its 95% interval, the exact-match
  positives (marked under ``measures.MIN_POSITIVES``) and the sequence ECEs' null bands
  (mean, and 97.5% quantile in parentheses)."""
  from meshbayes.metrics.measures import MIN_POSITIVES

  head = ["predictive", *(c[1] for c in COLUMNS), "positives (of sources)",
          "sequence ECE null band %", "fraction ECE null band %"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, figure in figures.items():
    band = lambda f: (f"{100 * figure[f + '_null_mean'].estimate:.2f} "
                      f"({100 * figure[f + '_null_high'].estimate:.2f})")
    positives = figure["exact_match_positives"].estimate
    cells = [name, *(figure[key].format(spec, scale) for key, _, scale, spec in COLUMNS),
             f"{positives:.0f} of {figure['num_items'].estimate:.0f}"
             + (f" (under {MIN_POSITIVES}: underpowered)" if positives < MIN_POSITIVES else ""),
             band("sequence_ece"), band("fraction_ece")]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
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
    return run(args)
  if args.command == "export":
    meta = export(args.task, Path(args.out))
    print(strict_json.dumps(meta, indent=1))
    print(f"export: {args.out}, {meta['bytes'] / 2**20:.1f} MiB")
    return meta
  arrays, meta = load_arrays(Path(args.arrays))
  figures = score(arrays, meta, Path(args.outputs), args.bootstrap_resamples)
  table = markdown(figures)
  print(table, end="")
  if args.markdown:
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(table)
  if args.json:
    from meshbayes.evaluation.items import as_json

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(strict_json.dumps(as_json(figures), null_reasons=strict_json.NULL_REASONS,
                                                 indent=1) + "\n")
  return figures


if __name__ == "__main__":
  main()
