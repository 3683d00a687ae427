"""Inference from a checkpoint (``python -m meshbayes.infer``): a file of inputs, one per
line, decoded into a file of outputs, with each output's probability and uncertainty.

One output line per input line, always: an empty (or blank) input line gives an
empty output line and a scores record marked ``"empty": true``. Inputs longer
than the task's input length are truncated (EOS kept), with one warning line
naming the first few by line number and tokens cut. Files may be local or on
a bucket (``gs://``, through ``etils.epath``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from etils import epath

from meshbayes import checkpoints as checkpoints_lib
from meshbayes.atomic_files import same_file, write_text_atomically
from meshbayes import ivon as ivon_lib
from meshbayes import predictive_eval
from meshbayes.data.pipeline import TaskData, get_task, vocabulary_fingerprint
from meshbayes.field_checks import positive_int
from meshbayes.layers import WeightPosterior, holds_posterior
from meshbayes.models.base import BaseModel
from meshbayes.optimizers import IVON_META
from meshbayes.partitioning import Partitioner

SCORES_SUFFIX = ".scores.jsonl"
NAMED_TRUNCATIONS = 5  # truncated inputs named one by one in the warning
_NOTHING_MEASURED = {"log_prob": None, "num_tokens": 0, "entropy": None,
                     "mutual_information": None}


def restore_params(model_dir: str | Path, model: BaseModel, data: TaskData,
                   partitioner: Partitioner, step: int | None = None) -> tuple[Any, int]:
  """The parameters of a checkpoint, sharded for ``partitioner``, and its step; a
  vocabulary other than the run's is refused (``check_vocabulary``).

  An IVON run's are its posterior: a ``WeightPosterior`` of the parameters
  (the mean) and the stddevs from the saved Hessian estimate, which
  evaluation and decoding take in place of the parameters.
  """
  shapes = data.input_shapes()
  params = jax.eval_shape(lambda k: model.get_initial_variables(k, shapes)["params"],
                          jax.random.key(0))
  step_dir = checkpoints_lib.find_step_dir(model_dir, step)
  meta = checkpoints_lib.read_meta(step_dir)
  check_vocabulary(meta, data, model_dir)
  ivon = meta.get(IVON_META)
  target = {"params": params}
  if ivon:
    target["opt_state"] = {"hessian": jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), params)}
  restored = checkpoints_lib.restore_subtree(step_dir, partitioner.placed(target))
  if ivon:
    stddev = jax.jit(ivon_lib.posterior_stddev, static_argnums=(1, 2))(
        restored["opt_state"]["hessian"], float(ivon["ess"]), float(ivon["weight_decay"]))
    return WeightPosterior(restored["params"], stddev), int(step_dir.name)
  return restored["params"], int(step_dir.name)


def check_vocabulary(meta: dict[str, Any], data: TaskData, model_dir: str | Path) -> None:
  """Raises a one-line ValueError when ``data``'s vocabulary is not the one the run
  was trained with (its checkpoint's ``meta``; runs older than the record pass)."""
  trained = meta.get("vocabulary")
  given = vocabulary_fingerprint(data.vocabulary)
  if trained is not None and trained != given:
    task = f" of task {meta['task']!r}" if meta.get("task") else ""
    raise ValueError(f"the run {model_dir} was trained with the vocabulary{task} ({trained}), "
                     f"not with task {data.task!r}'s ({given}): use the run's task, or one "
                     "with its vocabulary")


def as_trained(model: BaseModel, data: TaskData, model_dir: str | Path,
               step: int | None = None) -> BaseModel:
  """``model`` with the KL divisor ``D`` (``num_train_units``) the run was trained
  with, whatever task is evaluated; says so on stderr when the task is not the
  run's (out-of-distribution evaluation: allowed, the vocabulary being the same)."""
  meta = checkpoints_lib.read_meta(checkpoints_lib.find_step_dir(model_dir, step))
  say = (lambda line: print(line, file=sys.stderr, flush=True)) if (
      jax.process_index() == 0) else (lambda line: None)
  if meta.get("task") and meta["task"] != data.task:
    say(f"note: the run {model_dir} was trained on task {meta['task']!r}; evaluating it on "
        f"{data.task!r} (the same vocabulary) is out-of-distribution")
  if not hasattr(model, "num_train_units"):
    return model
  if "num_train_units" not in meta:
    if model.is_bayesian:
      say(f"warning: the run {model_dir} does not record its training set's size; the KL "
          f"divisor D = {model.num_train_units:,.0f} is task {data.task!r}'s")
    return model
  return dataclasses.replace(model, num_train_units=float(meta["num_train_units"]))


def read_lines(path: str | Path, skip_empty: bool = False) -> list[str]:
  """The lines of a UTF-8 text file (local or ``gs://``), with a one-line error when it is
  missing or a line is not UTF-8.

  Only ``\\n`` ends a line (a trailing ``\\r`` is dropped), so the lines are those
  ``wc -l`` counts, whatever Unicode line separators the text holds.
  """
  path = epath.Path(path)
  if not path.is_file():
    raise ValueError(f"input file {str(path)!r} does not exist")
  raw = path.read_bytes().split(b"\n")
  if raw[-1] == b"":
    raw.pop()  # the last newline ends a line; it does not start one
  lines = []
  for number, line in enumerate(raw, 1):
    try:
      text = line.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError as error:
      raise ValueError(f"{path}:{number}: not valid UTF-8 (byte 0x{line[error.start]:02x} at "
                       f"position {error.start + 1} of the line)") from None
    if text.strip() or not skip_empty:
      lines.append(text)
  return lines


@dataclasses.dataclass(frozen=True)
class EncodedLines:
  """Lines of text as encoder inputs.

  Attributes:
    rows: ``(lines, length)`` token ids, EOS-terminated and zero-padded; a
      blank line is an all-zero row (no input, nothing to decode).
    tokens_cut: ``(lines,)`` tokens each line lost to fit ``length`` (EOS kept).
  """

  rows: np.ndarray
  tokens_cut: np.ndarray

  @property
  def present(self) -> np.ndarray:
    """Which lines hold an input."""
    return self.rows.any(-1)


def encode_inputs(lines: Sequence[str], vocabulary: Any, length: int,
                  source: str = "input") -> EncodedLines:
  """Each line's token ids, truncated to ``length`` and EOS-terminated.

  Raises:
    ValueError: naming ``source`` and the line number of a line the vocabulary
      cannot encode.
  """
  rows = np.zeros((len(lines), length), np.int32)
  tokens_cut = np.zeros(len(lines), np.int64)
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      ids = list(vocabulary.encode(line.strip()))
    except ValueError as error:
      raise ValueError(f"{source}:{number}: cannot encode {line.strip()!r}: {error}") from None
    tokens_cut[number - 1] = max(len(ids) + 1 - length, 0)
    ids = ids[:length - 1] + [vocabulary.eos_id]
    rows[number - 1, :len(ids)] = ids
  return EncodedLines(rows, tokens_cut)


def encode_lines(lines: Sequence[str], vocabulary: Any, length: int,
                 source: str = "input") -> np.ndarray:
  """``encode_inputs(...).rows``: the token ids alone."""
  return encode_inputs(lines, vocabulary, length, source).rows


def truncation_warning(tokens_cut: np.ndarray, source: str, length: int,
                       named: int = NAMED_TRUNCATIONS) -> str | None:
  """One line naming the first ``named`` truncated inputs (line number, tokens cut) and
  how many there are; None when no input was truncated."""
  truncated = np.flatnonzero(tokens_cut)
  if not truncated.size:
    return None
  plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"
  listed = ", ".join(f"line {i + 1} ({plural(int(tokens_cut[i]), 'token')} cut)"
                     for i in truncated[:named])
  more = f" and {truncated.size - named} more" if truncated.size > named else ""
  return (f"warning: {source}: {plural(truncated.size, 'input')} longer than the input length "
          f"{length} (EOS included) truncated: {listed}{more}")


def in_batches(rows: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
  """``rows`` in chunks of ``batch_size``, the last one padded with all-zero rows."""
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    yield np.pad(chunk, [(0, batch_size - len(chunk)), (0, 0)])


def output_lines(encoded: EncodedLines, records: Sequence[predictive_eval.Decoded],
                 vocabulary: Any, with_mutual_information: bool
                 ) -> tuple[list[str], list[dict[str, Any]]]:
  """The text output and the scores record of every input line, in order.

  Args:
    encoded: the inputs.
    records: one per present input, in order (``predictive_eval.decode_and_score``).
    vocabulary: decodes the outputs.
    with_mutual_information: the records come from a model average (else the
      mutual information, 0 by construction, is written as null).

  Returns:
    ``(texts, scores)``, one of each per input line (see ``infer``).
  """
  if len(records) != int(encoded.present.sum()):
    raise ValueError(f"output_lines: {len(records)} records for {int(encoded.present.sum())} "
                     "non-empty inputs")
  records = iter(records)
  texts, scores = [], []
  for number, (present, cut) in enumerate(zip(encoded.present, encoded.tokens_cut), 1):
    if present:
      record = next(records)
      # A newline inside an output would shift every later line.
      text = vocabulary.decode(list(record.output_ids)).replace("\n", " ")
      measured = {"log_prob": record.log_prob, "num_tokens": record.num_tokens,
                  "entropy": record.entropy, "mutual_information":
                  record.mutual_information if with_mutual_information else None}
    else:
      text, measured = "", _NOTHING_MEASURED
    texts.append(text)
    scores.append({"line": number, "empty": not present, "output": text, **measured,
                   "input_tokens_cut": int(cut)})
  return texts, scores


def infer(*, model_dir: str, model: BaseModel, data: TaskData, input_file: str,
          output_file: str, partitioner: Partitioner | None = None,
          checkpoint_step: int | None = None, decode_method: str = "beam", beam_size: int = 4,
          num_samples: int = 0, seed: int = 0) -> int:
  """Decodes each line of ``input_file`` into the same line of ``output_file``.

  Inputs are encoded with the task's input vocabulary and truncated to its
  input length (a warning names them); decodes use ``data.batch_size`` rows at
  a time, with a progress bar on stderr. ``<output_file>.scores.jsonl`` holds
  one JSON record per input line: ``line`` (1-based), ``empty`` (a blank
  input: nothing decoded, the scores null), ``output``, ``log_prob`` (of the
  output and its EOS under the predictive distribution, nats), ``num_tokens``
  (scored: output tokens + EOS, at most the target length), ``entropy`` and
  ``mutual_information`` (per-token means, nats; the latter null unless a
  model average), ``input_tokens_cut``. Process 0 writes the files and prints.

  Args:
    model_dir: the run's directory (its checkpoints).
    model: the model.
    data: the task (its vocabularies and feature lengths) and the batch size.
    input_file: text, one input per line (local or ``gs://``).
    output_file: where the outputs go, one per line (local or ``gs://``).
    partitioner: mesh and rules (default: data parallel).
    checkpoint_step: which checkpoint (default: the latest).
    decode_method: ``beam``, ``greedy`` or ``sample``.
    beam_size: beams for ``beam``.
    num_samples: 0 decodes a Bayesian model with its posterior mean, ``S > 0``
      with the model average of ``S`` weight samples (which gives the mutual
      information).
    seed: seed of weight samples and sampling.

  Returns:
    The number of lines written (as many as ``input_file`` has).
  """
  positive_int("infer", "num_samples", num_samples, allow_zero=True)
  scores_file = str(output_file) + SCORES_SUFFIX
  for name, path in (("OUTPUT_FILE", output_file), (f"OUTPUT_FILE + {SCORES_SUFFIX!r}",
                                                      scores_file)):
    if same_file(path, input_file):
      raise ValueError(f"infer: {name} {str(path)!r} is INPUT_FILE {str(input_file)!r} (it "
                       "would overwrite the inputs); give another OUTPUT_FILE")
  writer = jax.process_index() == 0
  length = data.feature_lengths["inputs"]
  encoded = encode_inputs(read_lines(input_file),
                          get_task(data.task).output_features["inputs"].vocabulary, length,
                          source=str(input_file))
  warning = truncation_warning(encoded.tokens_cut, str(input_file), length)
  if warning and writer:
    print(warning, file=sys.stderr, flush=True)
  partitioner = partitioner or Partitioner()
  try:  # before any work: decoding places BATCH_SIZE rows over the mesh's batch axes
    partitioner.data_layout(data.batch_size)
  except ValueError as error:
    raise ValueError(f"infer: BATCH_SIZE={data.batch_size}: {error}") from None
  params, _ = restore_params(model_dir, model, data, partitioner, checkpoint_step)
  predictive = predictive_eval.predictives(model.is_bayesian or holds_posterior(params),
                                           num_samples)[0]
  inputs = encoded.rows[encoded.present]  # empty lines take no room in the batches
  batches = tqdm.tqdm(in_batches(inputs, data.batch_size), desc="decoding", unit=" batches",
                      total=-(-len(inputs) // data.batch_size), disable=not writer,
                      file=sys.stderr)
  records = predictive_eval.decode_and_score(
      model, params, batches, partitioner, predictive, jax.random.key(seed),
      data.feature_lengths["targets"], data.vocabulary.eos_id, method=decode_method,
      beam_size=beam_size)
  texts, scores = output_lines(encoded, records, data.vocabulary,
                               with_mutual_information=predictive.num_samples > 0)
  if writer:
    output = epath.Path(output_file)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(output, "".join(text + "\n" for text in texts))
    write_text_atomically(scores_file, "".join(json.dumps(s) + "\n" for s in scores))
    print(f"decoded {len(texts)} lines of {input_file} ({len(texts) - len(inputs)} empty) into "
          f"{output_file}, scores in {scores_file}")
  return len(texts)
