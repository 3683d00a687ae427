"""A task's splits as token arrays for a device without seqio: decode there, score here.

- ``export`` (with seqio): the train, validation and test splits as the evaluation reads
  them (``data.arrays``) and the test split grouped by source (``source_arrays``: each
  source's references as token ids, ``sources.group_sources``), into one compressed ``.npz``.
- ``predict`` (neither seqio nor TensorFlow needed): each predictive's beam-decoded test
  sources and teacher-forced token statistics of the test pairs, as ``evaluate`` computes
  them, as named arrays (``as_arrays``; ``decoded_records`` reads them back).
- ``score`` (with the task's vocabulary): every figure of ``items`` from the evaluation's own
  items (``driver.source_items``) with bootstrap intervals over the sources
  (``split_sources``); ``markdown`` tabulates them (``COLUMNS``).

``tools/gpu_sequence_run.py`` is their command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from meshbayes import metrics
from meshbayes.data.arrays import (SPLITS, compact, in_batches, padded, split_arrays,
                                   split_features)
from meshbayes.data.pipeline import TaskData, get_task
from meshbayes.data.text_lines import in_batches as rows_in_batches
from meshbayes.evaluation import driver, items, predictives
from meshbayes.evaluation.decoding import DecodeContext, Decoded, decode_and_score
from meshbayes.evaluation.settings import PredictiveConfig
from meshbayes.evaluation.sources import Sources, group_sources
from meshbayes.metrics.measures import MIN_POSITIVES
from meshbayes.runtime import strict_json

# Columns of the table: (figure of evaluation.items, heading, scale, format).
COLUMNS = (("bleu", "BLEU", 1.0, ".2f"), ("exact_match", "exact match %", 100.0, ".2f"),
           ("sequence_ece", "sequence ECE %", 100.0, ".2f"),
           ("fraction_ece", "reference-fraction ECE %", 100.0, ".2f"),
           ("decoded_token_ece", "decoded-token ECE %", 100.0, ".2f"),
           ("calibration_auroc", "calibration AUROC", 1.0, ".3f"),
           ("token_ece", "token ECE % (teacher-forced)", 100.0, ".2f"))


def export(task: str, lengths: dict[str, int], out: Path) -> dict[str, Any]:
  """Writes ``task``'s splits at ``lengths`` and its test sources to ``out`` (``.npz``);
  returns the meta."""
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


def split_sources(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Sources:
  """The test split's sources (``evaluation.sources.Sources``), detokenized with the task's
  vocabularies."""
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


def predict(model: Any, params: Any, arrays: dict[str, np.ndarray], meta: dict[str, Any],
            partitioner: Any, num_samples: int, beam_size: int, batch_size: int
            ) -> dict[str, np.ndarray]:
  """Each predictive's decoded test sources and teacher-forced statistics of the test pairs,
  as ``evaluate`` computes them, as named arrays (``<predictive>/...``)."""
  lengths = meta["feature_lengths"]
  pairs = split_features(arrays, "test", lengths)
  sources = padded(arrays["test_source_inputs"], lengths["inputs"])
  rng = jax.random.key(PredictiveConfig().seed)
  result = {}
  for variant in predictives.predictives(model.is_bayesian, num_samples):
    _, per_row = predictives.token_calibration(model, params, in_batches(pairs, batch_size),
                                               partitioner, variant, rng)
    records = decode_and_score(
        DecodeContext(model, params, partitioner, variant, rng, lengths["targets"],
                      meta["eos_id"], {"method": "beam", "beam_size": beam_size}),
        rows_in_batches(sources, batch_size))
    result.update(as_arrays(variant.name, records, lengths["targets"]))
    result.update({f"{variant.name}/token_statistic/{k}": v[:len(arrays["test_inputs"])]
                   for k, v in per_row.items()})
  return result


def as_arrays(name: str, records: Sequence[Decoded], length: int) -> dict[str, np.ndarray]:
  """``Decoded`` records as arrays under ``name/``."""
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


def decoded_records(outputs: dict[str, np.ndarray], name: str) -> list[Decoded]:
  """The ``Decoded`` records ``as_arrays`` stored under ``name/``."""
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
          resamples: int, recipes: Sequence[str]) -> dict[str, dict[str, Any]]:
  """Every figure of each recipe's predictives (``evaluation.items.intervals``), keyed
  ``<recipe>/<predictive>``.

  Raises:
    ValueError: ``outputs_dir`` holds no ``<recipe>.npz`` of ``recipes``.
  """
  data = TaskData(meta["task"], meta["feature_lengths"], batch_size=1)
  sources = split_sources(arrays, meta)
  found = [name for name in recipes if (outputs_dir / f"{name}.npz").exists()]
  if not found:
    raise ValueError(f"--outputs={outputs_dir}: no {' or '.join(f'{n}.npz' for n in recipes)}")
  figures = {}
  for name in found:
    with np.load(outputs_dir / f"{name}.npz") as stored:
      outputs = {k: stored[k] for k in stored.files}
    for predictive in dict.fromkeys(k.split("/")[0] for k in outputs):  # the headline first
      statistics = {k.split("/", 2)[2]: v for k, v in outputs.items()
                    if k.startswith(f"{predictive}/token_statistic/")}
      # The evaluation's own items, so every figure is its figure.
      predictive_items = driver.source_items(
          data, sources, sources.sum_rows(statistics), decoded_records(outputs, predictive),
          metrics.DEFAULT_NUM_BINS)
      figures[f"{name}/{predictive}"] = items.intervals(predictive_items, resamples)
  return figures


def markdown(figures: dict[str, dict[str, Any]]) -> str:
  """One row per predictive: each column's estimate with its 95% interval, the exact-match
  positives (marked under ``measures.MIN_POSITIVES``) and the sequence ECEs' null bands
  (mean, and 97.5% quantile in parentheses)."""
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
