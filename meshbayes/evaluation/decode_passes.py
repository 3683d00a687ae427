"""The optional passes of a decoding (``decoding.decode_and_score``), one object each.

A pass says what it decodes besides the outputs (its programs), what it costs the
evaluation's plan (``units``: forward passes per batch, ``plan_cost``) and what it adds to
each batch's records (``add``). ``from_settings`` builds the passes ``DecodeConfig`` and
``PredictiveConfig`` ask for; an evaluation adds ``RescoreOutputs`` for a
temperature-scaled predictive and ``Resumable`` for its saved batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import jax
import numpy as np

from meshbayes import metrics, predictive
from meshbayes.evaluation.decoding import BatchStep, DecodeContext, Decoded, score_each, until_eos
from meshbayes.metrics import equivalence

if TYPE_CHECKING:
  from meshbayes.evaluation.predictives import Predictive
  from meshbayes.evaluation.settings import DecodeConfig, PredictiveConfig

# Folded into a batch's key for its equivalence samples: their draws apart from a sampled
# decode's (the model's sampling stream follows the key it is given).
EQUIVALENCE_STREAM = 0xE9
# Ancestral sampling of the predictive itself: no temperature, no filtering.
ANCESTRAL = {"method": "sample", "temperature": 1.0, "top_k": 0, "top_p": 1.0}


class DecodePass(Protocol):
  """One optional pass of ``decode_and_score``; each hook does nothing unless overridden.

  Attributes:
    replaces_decode: the pass gives the outputs (scored, not decoded).
  """

  replaces_decode: ClassVar[bool] = False

  def check(self, context: DecodeContext, passes: Sequence[DecodePass]) -> None:
    """Raises a one-line ValueError when the pass does not apply."""
    del context, passes

  def units(self, variant: Predictive, decode_units: int) -> int:
    """Forward passes per batch it adds for each of ``variant``'s weight samples, beside
    the ``decode_units`` (beam size, or 1) of the outputs' decode or scoring."""
    del variant, decode_units
    return 0

  def given_outputs(self, offset: int, count: int) -> list[list[int]] | None:
    """The outputs of the ``count`` present rows from record ``offset``, or None: decode."""
    del offset, count
    return None

  def saved(self, index: int) -> list[Decoded] | None:
    """Batch ``index``'s records if already done (not decoded again), else None."""
    del index
    return None

  def add(self, step: BatchStep) -> None:
    """Adds to the scored batch ``step`` (its measures, samples)."""
    del step

  def completed(self, index: int, records: list[Decoded]) -> None:
    """Batch ``index``'s records are complete."""
    del index, records


def plan_cost(passes: Sequence[DecodePass], variant: Predictive, beam: int
              ) -> tuple[str, int]:
  """``(kind, forward passes per batch)`` of decoding with ``passes`` for the plan
  (``evaluation.phases``): a ``score`` of given outputs or a ``decode`` of ``beam``
  beams, and each pass's ``units``, times ``variant``'s weight samples."""
  scoring = any(p.replaces_decode for p in passes)
  base = 1 if scoring else beam
  return ("score" if scoring else "decode",
          max(1, variant.num_samples) * (base + sum(p.units(variant, base) for p in passes)))


def from_settings(decoding: DecodeConfig, settings: PredictiveConfig
                  ) -> tuple[DecodePass, ...]:
  """The passes the settings ask for, in the order they add their measures."""
  passes: list[DecodePass] = []
  if settings.equivalence_samples:
    passes.append(EquivalenceSamples(settings.equivalence_samples))
  if settings.beam_measures:
    passes.append(BeamMeasures())
  if decoding.sample_agreement:
    passes.append(SampleAgreement())
  return tuple(passes)


@dataclasses.dataclass(frozen=True)
class BeamMeasures(DecodePass):
  """Scores each hypothesis of the beam under the output's weight samples and adds
  ``predictive.BEAM_MEASURES`` (the posterior mean: ``beam_total_uncertainty`` alone).

  Decodes nothing more (the beam is the decode's); ``beam_size - 1`` scoring passes per
  batch, which the plan has not counted (``units`` 0). Given outputs have no beam: then
  it adds nothing.
  """

  def check(self, context: DecodeContext, passes: Sequence[DecodePass]) -> None:
    if context.method != "beam":
      raise ValueError(f"decode_and_score: beam_measures=True needs method='beam', not "
                       f"{context.method!r}")

  def add(self, step: BatchStep) -> None:
    if step.decoded_aux is None:
      return
    sequences = jax.device_get(step.decoded_aux["all_sequences"])
    if step.context.predictive.num_samples > 1:
      step.measures.update(beam_measures(lambda rows: step.score(rows)[1]["sample_log_probs"],
                                         step, sequences, step.aux["sample_log_probs"]))
    else:  # one model: only the total uncertainty has a meaning
      step.measures["beam_total_uncertainty"] = beam_measures(
          lambda rows: step.score(rows)[0][None], step, sequences,
          step.log_probs[None])["beam_total_uncertainty"]


@dataclasses.dataclass(frozen=True)
class EquivalenceSamples(DecodePass):
  """Draws ``num_samples`` ``K`` ancestral samples of each input (temperature 1, no
  filtering; a key apart from the decode's) and scores each as the output is scored (the
  same weight samples, dropout masks and temperature): each record's ``samples`` and
  ``sample_log_probs``.

  Decodes with the ancestral sampler (``K`` rows per input) and adds ``K`` scoring passes
  per batch. ``given``: these samples (``K`` per present row, in order, without EOS) are
  rescored instead of drawn, with ``RescoreOutputs`` (a temperature-scaled predictive
  rescores its unscaled self's).
  """

  num_samples: int
  given: Sequence[Sequence[Sequence[int]]] | None = None

  def __post_init__(self):
    if not 0 < self.num_samples <= equivalence.MAX_SAMPLES:
      raise ValueError(f"decode_and_score: equivalence_samples={self.num_samples!r} must be "
                       f"from 1 to {equivalence.MAX_SAMPLES}")

  def check(self, context: DecodeContext, passes: Sequence[DecodePass]) -> None:
    if self.given is not None and not any(p.replaces_decode for p in passes):
      raise ValueError("decode_and_score: samples are rescored only with the outputs they "
                       "were drawn with; pass outputs too")

  def units(self, variant: Predictive, decode_units: int) -> int:
    return self.num_samples

  def add(self, step: BatchStep) -> None:
    context, k = step.context, self.num_samples
    if self.given is None:
      sample = context.programs(dict(ANCESTRAL, num_decodes=k))[0]
      drawn = sample(context.params, step.encoder_batch(),
                     jax.random.fold_in(step.key, EQUIVALENCE_STREAM))[1]["all_sequences"]
      step.samples = [[until_eos(ids, context.eos_id) for ids in row]
                      for row in jax.device_get(drawn)]
    else:
      step.samples = [[[]] * k for _ in range(len(step.inputs))]
      for j, row in enumerate(step.present):
        step.samples[row] = [list(ids) for ids in self.given[step.offset + j]]
    for row, drawn in enumerate(step.samples):
      if len(drawn) != k:
        raise ValueError(f"decode_and_score: row {row} has {len(drawn)} samples, not "
                         f"equivalence_samples={k}")
    scores, _ = score_each(lambda rows: step.score(rows)[0], step, step.samples)
    step.sample_log_probs = np.stack(scores, -1)


@dataclasses.dataclass(frozen=True)
class SampleAgreement(DecodePass):
  """For a model average of ``S`` > 1 samples, decodes with each sample alone and adds
  ``bleu_disagreement``: 100 minus the mean sentence BLEU between the samples' outputs
  over ordered pairs (Malinin and Gales's "BLEU variance"; token ids as words).

  ``S`` more decodes per batch (the one-sample decode program), given outputs or not.
  """

  def units(self, variant: Predictive, decode_units: int) -> int:
    return decode_units * variant.num_samples

  def add(self, step: BatchStep) -> None:
    context = step.context
    num_samples = context.predictive.num_samples
    if num_samples <= 1:
      return
    decode_alone = context.programs()[2]
    batch = step.encoder_batch()
    step.measures["bleu_disagreement"] = bleu_disagreement(
        lambda s: decode_alone(context.params, batch, step.key, s), num_samples,
        len(step.inputs), context.eos_id)


@dataclasses.dataclass(frozen=True)
class RescoreOutputs(DecodePass):
  """Scores ``outputs`` (one per present row, in order, without EOS) instead of decoding:
  a temperature-scaled predictive scores what its unscaled self decoded. One scoring
  pass per batch instead of the decode (``replaces_decode``)."""

  outputs: Sequence[Sequence[int]]
  replaces_decode: ClassVar[bool] = True

  def given_outputs(self, offset: int, count: int) -> list[list[int]]:
    return [list(ids) for ids in self.outputs[offset:offset + count]]


@dataclasses.dataclass(frozen=True)
class Resumable(DecodePass):
  """Takes ``done``, the records of the first ``len(done)`` batches of an interrupted
  decoding with the same settings, as they are (later batches keep their keys, so the
  result is the uninterrupted one's), and hands each new batch's records to ``on_batch``
  (``evaluation.resumable.DecodeLog.save``). Costs nothing more."""

  done: Sequence[Sequence[Decoded]] = ()
  on_batch: Callable[[int, list[Decoded]], None] | None = None

  def saved(self, index: int) -> list[Decoded] | None:
    return list(self.done[index]) if index < len(self.done) else None

  def completed(self, index: int, records: list[Decoded]) -> None:
    if self.on_batch is not None:
      self.on_batch(index, records)


def bleu_disagreement(decode_alone: Callable[[int], Any], num_samples: int, num_rows: int,
                      eos_id: int) -> np.ndarray:
  """``(batch,)`` 100 minus the pairwise BLEU of the outputs each of the ``num_samples``
  weight samples decodes alone (``decode_alone(s)``: sample ``s``'s tokens)."""
  each = [[until_eos(row, eos_id) for row in jax.device_get(decode_alone(s))]
          for s in range(num_samples)]
  return 100.0 - np.array([pairwise_bleu([alone[row] for alone in each])
                           for row in range(num_rows)])


def pairwise_bleu(outputs: Sequence[Sequence[int]]) -> float:
  """Mean sentence BLEU of each output against each other one (ordered pairs), token ids
  as words; 100 when all agree.

  >>> pairwise_bleu([[5, 6, 7, 8], [5, 6, 7, 8], []]) == 100 / 3
  True
  """
  texts = [" ".join(map(str, ids)) for ids in outputs]
  pairs = [(a, b) for i, a in enumerate(texts) for j, b in enumerate(texts) if i != j]
  scores = np.clip(metrics.sentence_bleus([a for a, _ in pairs], [b for _, b in pairs],
                                          tokenize="none"), 0.0, 100.0)
  # Identical outputs agree fully, empty ones included (BLEU gives those 0).
  return float(np.mean([100.0 if a == b else x for (a, b), x in zip(pairs, scores)]))


def beam_hypotheses(sequences: np.ndarray, eos_id: int
                    ) -> tuple[list[list[list[int]]], np.ndarray]:
  """Each row's beam hypotheses (``sequences``: ``(batch, B, length)``) without EOS and
  padding, and ``(batch, B)`` whether each is present: an empty slot of the beam (no
  token, not even EOS) or a repeat of an earlier hypothesis of its row is not."""
  outputs, present = [], np.zeros(sequences.shape[:2], bool)
  for row, beams in enumerate(sequences):
    outputs.append([until_eos(ids, eos_id) for ids in beams])
    seen = set()
    for b, (ids, output) in enumerate(zip(beams, outputs[-1])):
      present[row, b] = bool(np.any(ids > 0)) and tuple(output) not in seen
      seen.add(tuple(output))
  return outputs, present


def beam_measures(score_rows: Callable[[dict[str, np.ndarray]], np.ndarray], step: BatchStep,
                  sequences: np.ndarray, best_log_probs: np.ndarray) -> dict[str, np.ndarray]:
  """``predictive.beam_sequence_measures`` of each row's beam.

  Beam position ``b`` of every row is scored as one batch (``score_rows``: a teacher-
  forcing batch to ``(S, batch)`` sample log-probabilities; ``decoding.score_each``).
  Position 0, the decoded output, is given (``best_log_probs``, ``step.counts``); absent
  hypotheses (``beam_hypotheses``) are left out.
  """
  outputs, present = beam_hypotheses(sequences, step.context.eos_id)
  scores, lengths = score_each(score_rows, step, outputs, start=1)
  sample_log_probs = np.where(present, np.stack([np.asarray(best_log_probs), *scores], -1),
                              -np.inf)
  return {name: np.asarray(value) for name, value in predictive.beam_sequence_measures(
      sample_log_probs, np.stack([np.asarray(step.counts), *lengths], -1)).items()}
