"""Inference from a checkpoint (``python -m meshbayes.infer``): a file of inputs, one per
line, decoded into a file of outputs, with each output's probability and uncertainty.

One output line per input line, always (a blank input gives an empty line and a scores
record marked ``"empty": true``); too-long inputs are truncated with one warning line.
Files may be local or ``gs://``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import tqdm
from etils import epath

from meshbayes.data.pipeline import TaskData, get_task
from meshbayes.evaluation import predictives as predictive_eval
from meshbayes.field_checks import positive_int
from meshbayes.layers import holds_posterior
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner
from meshbayes.runtime.atomic_files import same_file, write_text_atomically
from meshbayes.training.checkpoint_restore import restore_params
from meshbayes.data.text_lines import (EncodedLines, encode_inputs, in_batches, read_lines,
                                  truncation_warning)

SCORES_SUFFIX = ".scores.jsonl"
_NOTHING_MEASURED = {"log_prob": None, "num_tokens": 0, "entropy": None,
                     "mutual_information": None}


def output_lines(encoded: EncodedLines, records: Sequence[predictive_eval.Decoded],
                 vocabulary: Any, with_mutual_information: bool
                 ) -> tuple[list[str], list[dict[str, Any]]]:
  """The text output and the scores record of every input line, in order.

  Args:
    encoded: the inputs.
    records: one per present input, in order (``evaluation.predictives.decode_and_score``).
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
