"""Evaluation and inference of a checkpoint: ``python -m meshbayes.eval`` and ``.infer``.

Both restore only the parameters, placed on the partitioner's mesh, from the
latest (or a given) checkpoint in ``MODEL_DIR``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from meshbayes import checkpoints as checkpoints_lib
from meshbayes.data.pipeline import DataLayout, TaskData, get_task
from models.base import BaseModel
from partitioning import Partitioner


def host_layout(partitioner: Partitioner, batch_size: int) -> DataLayout:
  layout = partitioner.data_layout(batch_size)
  return DataLayout(layout.per_host_batch_size, layout.shard_id, layout.num_shards)


def restore_params(model_dir: str | Path, model: BaseModel, data: TaskData,
                   partitioner: Partitioner, step: int | None = None) -> tuple[Any, int]:
  """The parameters of a checkpoint, sharded for ``partitioner``, and its step."""
  shapes = data.input_shapes()
  abstract = jax.eval_shape(lambda k: {"params": model.get_initial_variables(k, shapes)["params"]},
                            jax.random.key(0))
  step_dir = checkpoints_lib.find_step_dir(model_dir, step)
  return (checkpoints_lib.restore_subtree(step_dir, partitioner.placed(abstract))["params"],
          int(step_dir.name))


def teacher_forced_metrics(eval_fn, params: Any, batches: Iterable[dict[str, np.ndarray]],
                           partitioner: Partitioner) -> dict[str, float]:
  """``eval_fn``'s metrics over ``batches``, weighted by their target tokens."""
  totals: dict[str, float] = {}
  num_tokens = 0.0
  with partitioner.activation_rules():
    for batch in batches:
      metrics = jax.device_get(eval_fn(params, partitioner.global_batch(batch)))
      tokens = float(metrics["num_tokens"])
      for name, value in metrics.items():
        totals[name] = totals.get(name, 0.0) + float(value) * tokens
      num_tokens += tokens
  return {name: total / max(num_tokens, 1.0) for name, total in totals.items()
          if name != "num_tokens"} | {"num_tokens": num_tokens}


def _decode_fn(model: BaseModel, partitioner: Partitioner, param_shardings: Any,
               max_length: int, **decode_kwargs: Any):
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  return jax.jit(functools.partial(model.predict_batch_with_aux, max_length=max_length,
                                   **decode_kwargs),
                 in_shardings=(param_shardings, batch, None))


def _until_eos(ids: np.ndarray, eos_id: int) -> list[int]:
  ids = [int(i) for i in ids if i > 0]
  return ids[:ids.index(eos_id)] if eos_id in ids else ids


def evaluate(*, model_dir: str, model: BaseModel, data: TaskData,
             partitioner: Partitioner | None = None, checkpoint_step: int | None = None,
             split: str | None = None, decode: bool = True, decode_method: str = "beam",
             beam_size: int = 4, num_samples: int = 0, seed: int = 0) -> dict[str, float]:
  """Teacher-forced and inference evaluation of a checkpoint on a split.

  Writes ``MODEL_DIR/eval/<task>/metrics.json`` and, when decoding,
  ``predictions.jsonl`` (input, target, prediction, score per example).

  Args:
    model_dir: the run's directory.
    model: the model.
    data: the task (``eval_split`` unless ``split`` is given).
    partitioner: mesh and rules (default: data parallel).
    checkpoint_step: which checkpoint (default: the latest).
    split: the split to evaluate.
    decode: also decode every input and report exact-match accuracy.
    decode_method: ``beam``, ``greedy`` or ``sample``.
    beam_size: beams for ``beam``.
    num_samples: 0 decodes with the posterior mean, S > 0 averages S weight
      samples (Bayesian model averaging).
    seed: seed of weight samples and sampling.

  Returns:
    The metrics.
  """
  partitioner = partitioner or Partitioner()
  params, step = restore_params(model_dir, model, data, partitioner, checkpoint_step)
  layout = host_layout(partitioner, data.batch_size)
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  eval_fn = jax.jit(lambda p, b: model.eval_fn(p, b)[1], in_shardings=(
      param_shardings, NamedSharding(partitioner.mesh, partitioner.batch_spec)))
  split = split or data.eval_split
  metrics = teacher_forced_metrics(eval_fn, params, data.eval_batches(layout, split), partitioner)
  out_dir = Path(model_dir) / "eval" / data.task
  out_dir.mkdir(parents=True, exist_ok=True)
  if decode:
    predict = _decode_fn(model, partitioner, param_shardings, data.feature_lengths["targets"],
                         method=decode_method, beam_size=beam_size, num_samples=num_samples)
    vocabulary = data.vocabulary
    eos = vocabulary.eos_id
    correct = total = 0
    with open(out_dir / "predictions.jsonl", "w") as out, partitioner.activation_rules():
      for i, batch in enumerate(data.eval_batches(layout, split)):
        tokens, aux = jax.device_get(predict(params, partitioner.global_batch(batch),
                                             jax.random.fold_in(jax.random.key(seed), i)))
        for row in range(tokens.shape[0]):
          if not batch["decoder_loss_weights"][row].any():
            continue  # padding row
          target = _until_eos(batch["decoder_target_tokens"][row], eos)
          prediction = _until_eos(tokens[row], eos)
          correct += prediction == target
          total += 1
          out.write(json.dumps({
              "input": vocabulary.decode(_until_eos(batch["encoder_input_tokens"][row], eos)),
              "target": vocabulary.decode(target), "prediction": vocabulary.decode(prediction),
              "score": float(aux["scores"][row])}) + "\n")
    metrics.update(sequence_accuracy=correct / max(total, 1), num_decoded=total)
  metrics.update(step=step)
  (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
  print(f"evaluated step {step} on {data.task}/{split}: " + ", ".join(
      f"{k} {v:.4g}" for k, v in metrics.items()))
  return metrics


def _read_inputs(path: Path, vocabulary, length: int) -> Iterator[np.ndarray]:
  for number, line in enumerate(path.read_text().splitlines(), 1):
    try:
      ids = list(vocabulary.encode(line.strip()))
    except ValueError as error:
      raise ValueError(f"{path}:{number}: cannot encode {line.strip()!r}: {error}") from None
    ids = ids[:length - 1] + [vocabulary.eos_id]
    yield np.pad(np.asarray(ids, np.int32), (0, length - len(ids)))


def infer(*, model_dir: str, model: BaseModel, data: TaskData, input_file: str,
          output_file: str, partitioner: Partitioner | None = None,
          checkpoint_step: int | None = None, decode_method: str = "beam", beam_size: int = 4,
          num_samples: int = 0, seed: int = 0) -> int:
  """Decodes each line of ``input_file`` into the same line of ``output_file``.

  Inputs are encoded with the task's input vocabulary and truncated to its
  input length; decodes use ``data.batch_size`` rows at a time. A JSON-lines
  file ``<output_file>.scores.jsonl`` holds each output's score.

  Returns:
    The number of lines decoded.
  """
  partitioner = partitioner or Partitioner()
  params, _ = restore_params(model_dir, model, data, partitioner, checkpoint_step)
  task = get_task(data.task)
  input_vocabulary = task.output_features["inputs"].vocabulary
  output_vocabulary = data.vocabulary
  inputs = list(_read_inputs(Path(input_file), input_vocabulary, data.feature_lengths["inputs"]))
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  predict = _decode_fn(model, partitioner, param_shardings, data.feature_lengths["targets"],
                       method=decode_method, beam_size=beam_size, num_samples=num_samples)
  rows = data.batch_size
  outputs, scores = [], []
  with partitioner.activation_rules():
    for start in range(0, len(inputs), rows):
      chunk = np.stack(inputs[start:start + rows])
      padded = np.pad(chunk, [(0, rows - len(chunk)), (0, 0)])
      tokens, aux = jax.device_get(predict(params, partitioner.global_batch(
          {"encoder_input_tokens": padded}), jax.random.fold_in(jax.random.key(seed), start)))
      for row in range(len(chunk)):
        outputs.append(output_vocabulary.decode(_until_eos(tokens[row], output_vocabulary.eos_id)))
        scores.append(float(aux["scores"][row]))
  Path(output_file).write_text("".join(line + "\n" for line in outputs))
  Path(str(output_file) + ".scores.jsonl").write_text(
      "".join(json.dumps({"output": o, "score": s}) + "\n" for o, s in zip(outputs, scores)))
  print(f"decoded {len(outputs)} lines of {input_file} into {output_file}")
  return len(outputs)
