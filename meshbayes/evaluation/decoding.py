"""Decoding inputs and scoring each output under the predictive that decoded it.

``decode_and_score`` is the loop: each batch of inputs is decoded (or its outputs are
given), its outputs scored under the same weight samples (a temperature rescales only the
scores) with every measure of ``meshbayes.predictive``, then handed to the optional passes
(``evaluation.decode_passes``: beam measures, equivalence samples, BLEU disagreement,
rescoring, resuming), which add to its records. ``DecodeContext``: what every batch reads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from meshbayes import predictive as measures_lib
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner

if TYPE_CHECKING:
  from meshbayes.evaluation.decode_passes import DecodePass
  from meshbayes.evaluation.predictives import Predictive

Batch = dict[str, np.ndarray]
# The decoding methods and the options each reads (``predict_batch_with_aux``); the others
# leave its program unchanged, so they are dropped from the programs' cache key: a greedy
# decode of the split (given a beam size) and of the OOD sets share one compiled program.
DECODE_OPTIONS = {"beam": {"beam_size", "alpha"}, "greedy": set(),
                   "sample": {"num_decodes", "temperature", "top_k", "top_p"}}


@dataclasses.dataclass(frozen=True)
class Decoded:
  """One decoded input.

  Attributes:
    output_ids: the output, without EOS and padding.
    log_prob: log-probability of the output (EOS included) under the
      predictive distribution.
    num_tokens: tokens scored (the output and its EOS).
    entropy: mean per-token entropy of the predictive distribution (nats).
    mutual_information: mean per-token mutual information between the next
      token and the weights (nats; 0 for the posterior mean).
    measures: every uncertainty measure of the output (``predictive``'s
      ``TOKEN_MEASURES``, averaged over its tokens, and ``SEQUENCE_MEASURES``):
      all of them for a model average; the total uncertainties alone for the
      posterior mean; more from the passes (``decode_passes.BeamMeasures``,
      ``SampleAgreement``).
    token_log_probs: each scored token's log-probability under the predictive (a
      temperature's included): the output's tokens, then its EOS.
    samples: with ``decode_passes.EquivalenceSamples`` ``K``, ``K`` ancestral samples of
      the input, without EOS and padding (repeats kept); else empty.
    sample_log_probs: each sample's log-probability under the predictive, as
      ``log_prob`` is the output's (the same weight samples and temperature).
  """

  output_ids: tuple[int, ...]
  log_prob: float
  num_tokens: int
  entropy: float
  mutual_information: float
  measures: Mapping[str, float] = dataclasses.field(default_factory=dict)
  token_log_probs: tuple[float, ...] = ()
  samples: tuple[tuple[int, ...], ...] = ()
  sample_log_probs: tuple[float, ...] = ()


def until_eos(ids: Iterable[int], eos_id: int) -> list[int]:
  """The ids before the first EOS, padding dropped."""
  ids = [int(i) for i in ids if i > 0]
  return ids[:ids.index(eos_id)] if eos_id in ids else ids


def as_targets(outputs: Sequence[Sequence[int]], length: int, eos_id: int) -> Batch:
  """A teacher-forcing batch whose targets are ``outputs`` followed by EOS."""
  targets = np.zeros((len(outputs), length), np.int32)
  for row, ids in enumerate(outputs):
    ids = (list(ids) + [eos_id])[:length]
    targets[row, :len(ids)] = ids
  inputs = np.pad(targets[:, :-1], [(0, 0), (1, 0)])
  return {"decoder_target_tokens": targets, "decoder_input_tokens": inputs,
          "decoder_loss_weights": (targets > 0).astype(np.int32)}


def batch_sharding(partitioner: Partitioner) -> NamedSharding:
  """Where a global batch's rows go on ``partitioner``'s mesh."""
  return NamedSharding(partitioner.mesh, partitioner.batch_spec)


def decode_items(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
  """``options`` as a cache key: those ``options['method']`` reads (``DECODE_OPTIONS``)."""
  read = DECODE_OPTIONS.get(options.get("method", "beam"))
  return tuple(sorted((name, value) for name, value in options.items()
                      if read is None or name == "method" or name in read))


@functools.lru_cache(maxsize=16)
def programs(model: BaseModel, num_samples: int, max_length: int,
             items: tuple[tuple[str, Any], ...], param_tree: Any,
             param_shardings: tuple[Any, ...], sharding: NamedSharding
             ) -> tuple[Any, Any, Any]:
  """The jitted decode, score (its last argument the calibration temperature) and
  one-sample decode, built once per model, number of weight samples and options: an
  evaluation decodes the split and each OOD set, and scores every temperature, with the
  same programs, compiled once."""
  decode_kwargs = dict(items, num_samples=num_samples, max_length=max_length)
  shardings = jax.tree.unflatten(param_tree, param_shardings)
  decode = jax.jit(functools.partial(model.predict_batch_with_aux, **decode_kwargs),
                   in_shardings=(shardings, sharding, None))
  score = jax.jit(
      lambda params, batch, key, temperature: model.score_batch(
          params, batch, key, num_samples=num_samples, calibration_temperature=temperature),
      in_shardings=(shardings, sharding, None, None))
  decode_alone = jax.jit(
      lambda params, batch, key, index: model.predict_batch_with_aux(
          params, batch, key, sample_index=index, **decode_kwargs)[0],
      in_shardings=(shardings, sharding, None, None))
  return decode, score, decode_alone


@dataclasses.dataclass(frozen=True)
class DecodeContext:
  """What every batch of one decoding reads.

  Attributes:
    model: the model.
    params: its parameters, sharded for ``partitioner``.
    partitioner: mesh and rules.
    predictive: decode and score with the posterior mean or a model average.
    rng: key of weight samples and sampling (batch ``i`` decodes and scores under
      ``fold_in(rng, i)``).
    max_length: most output tokens, EOS included.
    eos_id: end of sequence.
    options: ``predict_batch_with_aux`` options (``method``, default ``beam``;
      ``beam_size``, ...).
  """

  model: BaseModel
  params: Any
  partitioner: Partitioner
  predictive: Predictive
  rng: jax.Array
  max_length: int
  eos_id: int
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def method(self) -> str:
    return self.options.get("method", "beam")

  @functools.cached_property
  def _own_programs(self) -> tuple[Any, Any, Any]:
    return self.programs(self.options)

  def programs(self, options: Mapping[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """``programs`` (decode, score, one-sample decode) for ``options`` (default: its own,
    looked up once)."""
    if options is None:
      return self._own_programs
    shardings = jax.tree.map(lambda x: x.sharding, self.params)
    return programs(self.model, self.predictive.num_samples, self.max_length,
                    decode_items(options), jax.tree.structure(shardings),
                    tuple(jax.tree.leaves(shardings)), batch_sharding(self.partitioner))


@dataclasses.dataclass
class BatchStep:
  """One batch as the passes see it: its outputs scored, to add to.

  Attributes:
    context: the decoding.
    inputs: ``(batch, input length)`` encoder input tokens (all-zero rows: padding).
    key: the batch's key (its weight samples and sampling).
    present: the non-empty rows.
    offset: the records before this batch's (where its rows are among given items).
    outputs: each row's output, without EOS.
    decoded_aux: the decode's aux (``all_sequences``: the beam), None for given outputs.
    log_probs: ``(batch,)`` each output's log-probability.
    aux: ``score_batch``'s aux of the outputs.
    counts: ``(batch,)`` tokens scored (output and EOS).
    measures: ``(batch,)`` arrays by measure name, in the order the records keep.
    samples: each row's samples (``EquivalenceSamples``), else empty.
    sample_log_probs: ``(batch, K)`` their log-probabilities, else None.
  """

  context: DecodeContext
  inputs: np.ndarray
  key: jax.Array
  present: np.ndarray
  offset: int
  outputs: list[list[int]]
  decoded_aux: Mapping[str, Any] | None = None
  log_probs: np.ndarray | None = None
  aux: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
  counts: np.ndarray | None = None
  measures: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  samples: Sequence[Sequence[Sequence[int]]] = ()
  sample_log_probs: np.ndarray | None = None

  def encoder_batch(self) -> Any:
    """The inputs as a global batch, to decode."""
    return self.context.partitioner.global_batch({"encoder_input_tokens": self.inputs})

  def score(self, rows: Batch) -> tuple[np.ndarray, Mapping[str, np.ndarray]]:
    """``score_batch`` of a teacher-forcing batch of these inputs, under the batch's key
    (its weight samples and dropout masks) and the predictive's temperature."""
    context = self.context
    score = context.programs()[1]
    return jax.device_get(score(context.params, context.partitioner.global_batch(rows),
                                self.key, np.float32(context.predictive.temperature)))

  def targets(self, outputs: Sequence[Sequence[int]]) -> Batch:
    """A teacher-forcing batch of these inputs whose targets are ``outputs``."""
    return dict(as_targets(outputs, self.context.max_length, self.context.eos_id),
                encoder_input_tokens=self.inputs)

  def records(self) -> list[Decoded]:
    """One ``Decoded`` per present row."""
    records = []
    for row in self.present:
      row_measures = {name: float(value[row]) for name, value in self.measures.items()}
      records.append(Decoded(
          tuple(self.outputs[row]), float(self.log_probs[row]), int(self.counts[row]),
          row_measures["total_uncertainty"], row_measures.get("mutual_information", 0.0),
          row_measures, tuple(map(float, self.aux["token_log_probs"][row, :self.counts[row]])),
          tuple(map(tuple, self.samples[row])) if self.samples else (),
          () if self.sample_log_probs is None else tuple(map(float,
                                                             self.sample_log_probs[row]))))
    return records


def decode_and_score(context: DecodeContext, input_batches: Iterable[np.ndarray],
                     passes: Sequence[DecodePass] = ()) -> list[Decoded]:
  """Decodes each row of ``input_batches`` (``(batch, input length)`` token ids, all-zero
  rows skipped) and scores the outputs under the same predictive distribution: for a
  model average, under the very weight samples that decoded them; then each of
  ``passes`` (``evaluation.decode_passes``) adds to the batch's records, in order.

  Returns:
    One record per non-empty input row, in order.

  Raises:
    ValueError: a pass that does not apply to ``context`` or the other passes.
  """
  for each in passes:
    each.check(context, passes)
  records = []
  with context.partitioner.activation_rules():
    for i, inputs in enumerate(input_batches):
      saved = next((s for s in (p.saved(i) for p in passes) if s is not None), None)
      if saved is not None:  # an interrupted call's batch, taken as it is
        records.extend(saved)
        continue
      step = _scored(context, passes, i, inputs, len(records))
      for each in passes:
        each.add(step)
      batch_records = step.records()
      records.extend(batch_records)
      for each in passes:
        each.completed(i, batch_records)
  return records


def _scored(context: DecodeContext, passes: Sequence[DecodePass], index: int, inputs: np.ndarray,
            offset: int) -> BatchStep:
  """Batch ``index`` decoded (or its outputs given: rows ``offset`` on) and scored."""
  key = jax.random.fold_in(context.rng, index)  # decode and score under the same samples
  present = np.flatnonzero(inputs.any(-1))
  given = next((g for g in (p.given_outputs(offset, len(present)) for p in passes)
                if g is not None), None)
  step = BatchStep(context, inputs, key, present, offset, [[] for _ in range(len(inputs))])
  if given is None:
    tokens, step.decoded_aux = context.programs()[0](context.params, step.encoder_batch(), key)
    step.outputs = [until_eos(row, context.eos_id) for row in jax.device_get(tokens)]
  else:
    for row, output in zip(present, given):
      step.outputs[row] = list(output)
  batch = step.targets(step.outputs)
  step.log_probs, step.aux = step.score(batch)
  step.counts = batch["decoder_loss_weights"].sum(-1)
  step.measures = _measures(step.log_probs, step.aux, step.counts)
  return step


def _measures(log_probs: np.ndarray, aux: Mapping[str, np.ndarray], counts: np.ndarray
              ) -> dict[str, np.ndarray]:
  """Each output's uncertainty measures from ``score_batch``'s ``aux`` (``(batch,)`` each)."""
  n = np.maximum(counts, 1)
  measures = {"total_uncertainty": aux["token_entropy"].sum(-1) / n}
  for name in measures_lib.TOKEN_MEASURES[1:]:
    if f"token_{name}" in aux:
      measures[name] = aux[f"token_{name}"].sum(-1) / n
  if "sample_log_probs" in aux:
    measures.update({name: np.asarray(value) for name, value in
                     measures_lib.sequence_measures(aux["sample_log_probs"], counts).items()})
  else:  # one model: its sequence-level total uncertainty is its own -log P(y | x) / L
    measures["sequence_total_uncertainty"] = -log_probs / n
  return measures


def score_each(score_rows: Callable[[Batch], np.ndarray], step: BatchStep,
               candidates: Sequence[Sequence[Sequence[int]]], start: int = 0
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Position ``k`` (from ``start``) of every row's ``candidates`` scored as one batch by
  ``score_rows`` (a teacher-forcing batch of ``step``'s inputs to its scores), so each
  candidate gets its input's weight samples and dropout masks, as the output does; one
  cut at ``max_length`` without EOS is scored without it, as a decoded output is.

  Returns:
    ``(scores, lengths)``: per position, ``score_rows``' result and ``(batch,)`` tokens.
  """
  scores, lengths = [], []
  for k in range(start, len(candidates[0]) if len(candidates) else 0):
    batch = step.targets([list(row[k]) for row in candidates])
    scores.append(np.asarray(score_rows(batch)))
    lengths.append(batch["decoder_loss_weights"].sum(-1))
  return scores, lengths
