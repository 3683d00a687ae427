"""Passes over a split that measure predictions and their uncertainty.

``token_calibration``: teacher-forced token calibration statistics of the posterior mean
or the model average, per example and summed. ``decode_and_score``: decodes inputs and
scores each output under the predictive that decoded it (the same weight samples; a
temperature rescales only the scores), with every measure of ``meshbayes.predictive``
and optionally ``K`` scored ancestral samples. Figures: ``evaluation.items``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from meshbayes import metrics, predictive
from meshbayes.metrics import equivalence
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner

Batch = dict[str, np.ndarray]
TEMPERATURE_SCALED = "_temperature_scaled"
# Folded into a batch's key for its equivalence samples: their draws apart from a sampled
# decode's (the model's sampling stream follows the key it is given).
_EQUIVALENCE_STREAM = 0xE9
# Ancestral sampling of the predictive itself: no temperature, no filtering.
_ANCESTRAL = {"method": "sample", "temperature": 1.0, "top_k": 0, "top_p": 1.0}
# Temperatures tried by fit_temperature: log-spaced over [1/8, 8], 14% apart.
TEMPERATURE_GRID = tuple(np.exp(np.linspace(np.log(0.125), np.log(8.0), 33)).tolist())


@dataclasses.dataclass(frozen=True)
class Predictive:
  """Which predictive distribution: the posterior mean or a model average, optionally
  temperature-scaled.

  Attributes:
    name: ``posterior_mean`` or ``model_average``, with a ``_temperature_scaled``
      suffix for a fitted ``temperature``.
    num_samples: 0 (posterior mean) or ``S`` weight samples averaged.
    temperature: calibration temperature of the predictive distribution.
  """

  name: str
  num_samples: int = 0
  temperature: float = 1.0

  def __post_init__(self):
    base = self.name.removesuffix(TEMPERATURE_SCALED)
    if self.num_samples < 0 or (self.num_samples == 0) != (base == "posterior_mean") or (
        base not in ("posterior_mean", "model_average")):
      raise ValueError(f"Predictive: name={self.name!r} with num_samples={self.num_samples} "
                       "must be 'posterior_mean' with 0 or 'model_average' with S > 0")
    if not self.temperature > 0 or (self.temperature != 1.0 and base == self.name):
      raise ValueError(f"Predictive: temperature={self.temperature!r} must be positive, and "
                       f"1 unless the name ends with {TEMPERATURE_SCALED!r}")

  def temperature_scaled(self, temperature: float) -> Predictive:
    """This predictive at ``temperature``."""
    return Predictive(self.name + TEMPERATURE_SCALED, self.num_samples, temperature)


def predictives(is_bayesian: bool, num_samples: int) -> list[Predictive]:
  """The distributions to evaluate, the headline one first: the model average of
  ``num_samples`` weight samples for a Bayesian model (and its posterior mean),
  the only one for a deterministic model."""
  if is_bayesian and num_samples > 0:
    return [Predictive("model_average", num_samples), Predictive("posterior_mean")]
  return [Predictive("posterior_mean")]


def _batch_sharding(partitioner: Partitioner) -> NamedSharding:
  return NamedSharding(partitioner.mesh, partitioner.batch_spec)


def token_calibration(model: BaseModel, params: Any, batches: Iterable[Batch],
                      partitioner: Partitioner, predictive: Predictive, rng: jax.Array,
                      num_bins: int = metrics.DEFAULT_NUM_BINS
                      ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Teacher-forced token-level calibration over ``batches``.

  Returns:
    ``(metrics.token_calibration_metrics of the whole split, per-example statistics)``:
    the statistics of ``metrics.token_calibration_statistics`` of each row of each
    batch, in order (``(rows, ...)`` each; padding rows hold zeros).
  """
  param_shardings = jax.tree.map(lambda x: x.sharding, params)

  @functools.partial(jax.jit, in_shardings=(param_shardings, _batch_sharding(partitioner),
                                            None, None))
  def statistics(params, batch, rng, temperature):
    _, aux = model.score_batch(params, batch, rng, num_samples=predictive.num_samples,
                               return_log_probs=True, calibration_temperature=temperature)
    per_row = functools.partial(metrics.token_calibration_statistics, num_bins=num_bins)
    return jax.vmap(lambda *row: per_row(*(x[None] for x in row)))(
        aux["log_probs"], batch["decoder_target_tokens"],
        batch["decoder_loss_weights"].astype(jnp.float32))

  rows = []
  with partitioner.activation_rules():
    for i, batch in enumerate(batches):
      rows.append(jax.device_get(statistics(params, partitioner.global_batch(batch),
                                            jax.random.fold_in(rng, i),
                                            np.float32(predictive.temperature))))
  per_example = {k: np.concatenate([np.asarray(r[k], np.float64) for r in rows])
                 for k in rows[0]}
  return (metrics.token_calibration_metrics({k: v.sum(0) for k, v in per_example.items()}),
          per_example)


def fit_temperature(model: BaseModel, params: Any, batches: Iterable[Batch],
                    partitioner: Partitioner, predictive: Predictive, rng: jax.Array,
                    grid: Sequence[float] = TEMPERATURE_GRID) -> tuple[float, dict[str, Any]]:
  """Temperature scaling (Guo et al., 2017): the ``T`` minimizing the teacher-forced NLL
  per token of ``predictive``'s distribution ``p^(1/T)`` over ``batches``.

  The NLL of every ``T`` of ``grid`` is summed in one pass; a parabola through
  the best grid point and its neighbours (in ``log T``) refines it.

  Returns:
    ``(T, {'grid': [...], 'nll': [...], 'nll_at_1': ...})``.
  """
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  temperatures = jnp.asarray(grid, jnp.float32)

  @functools.partial(jax.jit, in_shardings=(param_shardings, _batch_sharding(partitioner),
                                            None))
  def nll_sums(params, batch, rng):
    _, aux = model.score_batch(params, batch, rng, num_samples=predictive.num_samples,
                               return_log_probs=True)
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    return (temperature_nll_sums(aux["log_probs"], batch["decoder_target_tokens"], weights,
                                 temperatures), jnp.sum(weights))

  totals, tokens = np.zeros(len(grid)), 0.0
  with partitioner.activation_rules():
    for i, batch in enumerate(batches):
      sums, count = jax.device_get(nll_sums(params, partitioner.global_batch(batch),
                                            jax.random.fold_in(rng, i)))
      totals, tokens = totals + sums, tokens + float(count)
  nll = totals / max(tokens, 1.0)
  return best_temperature(grid, nll), {
      "grid": list(grid), "nll": nll.tolist(), "tokens": tokens,
      "nll_at_1": float(np.interp(0.0, np.log(grid), nll)),
      "at_grid_edge": int(np.argmin(nll)) in (0, len(grid) - 1)}


def temperature_nll_sums(log_probs: jax.Array, targets: jax.Array, weights: jax.Array,
                         temperatures: jax.Array) -> jax.Array:
  """``[len(temperatures)]`` summed NLLs of ``targets`` under ``softmax(log_probs / T)``."""
  def nll(temperature):
    scaled = jax.nn.log_softmax(log_probs / temperature)
    return -jnp.sum(jnp.take_along_axis(scaled, targets[..., None], -1)[..., 0] * weights)
  return jax.lax.map(nll, temperatures)


def best_temperature(grid: Sequence[float], nll: Sequence[float]) -> float:
  """The grid's best temperature, refined by the vertex of the parabola (in ``log T``)
  through it and its two neighbours."""
  nll = np.asarray(nll, np.float64)
  best = int(np.argmin(nll))
  if not 0 < best < len(grid) - 1:
    return float(grid[best])
  x, y = np.log(np.asarray(grid[best - 1:best + 2], np.float64)), nll[best - 1:best + 2]
  a, b, _ = np.polyfit(x, y, 2)
  return float(np.exp(np.clip(-b / (2 * a), x[0], x[2]))) if a > 0 else float(grid[best])


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
      posterior mean; ``BEAM_MEASURES`` too with ``beam_measures`` (the posterior
      mean: ``beam_total_uncertainty``).
    token_log_probs: each scored token's log-probability under the predictive (a
      temperature's included): the output's tokens, then its EOS.
    samples: with ``equivalence_samples`` ``K``, ``K`` ancestral samples of the input,
      without EOS and padding (repeats kept); else empty.
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


def _as_targets(outputs: Sequence[list[int]], length: int, eos_id: int) -> Batch:
  """A teacher-forcing batch whose targets are ``outputs`` followed by EOS."""
  targets = np.zeros((len(outputs), length), np.int32)
  for row, ids in enumerate(outputs):
    ids = (ids + [eos_id])[:length]
    targets[row, :len(ids)] = ids
  inputs = np.pad(targets[:, :-1], [(0, 0), (1, 0)])
  return {"decoder_target_tokens": targets, "decoder_input_tokens": inputs,
          "decoder_loss_weights": (targets > 0).astype(np.int32)}


# The decoding methods and the options each reads (``predict_batch_with_aux``); the others
# leave its program unchanged, so they are dropped from the programs' cache key: a greedy
# decode of the split (given a beam size) and of the OOD sets share one compiled program.
DECODE_OPTIONS = {"beam": {"beam_size", "alpha"}, "greedy": set(),
                   "sample": {"num_decodes", "temperature", "top_k", "top_p"}}


def _decode_items(decode_kwargs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
  read = DECODE_OPTIONS.get(decode_kwargs.get("method", "beam"))
  return tuple(sorted((name, value) for name, value in decode_kwargs.items()
                      if read is None or name == "method" or name in read))


@functools.lru_cache(maxsize=16)
def _programs(model: BaseModel, num_samples: int, max_length: int,
              decode_items: tuple[tuple[str, Any], ...], param_tree: Any,
              param_shardings: tuple[Any, ...], batch_sharding: NamedSharding
              ) -> tuple[Any, Any, Any]:
  """``decode_and_score``'s jitted decode, score (its last argument the calibration
  temperature) and one-sample decode, built once per model, number of weight samples and
  options: an evaluation decodes the split and each OOD set, and scores every temperature,
  with the same programs, compiled once."""
  decode_kwargs = dict(decode_items, num_samples=num_samples, max_length=max_length)
  shardings = jax.tree.unflatten(param_tree, param_shardings)
  decode = jax.jit(functools.partial(model.predict_batch_with_aux, **decode_kwargs),
                   in_shardings=(shardings, batch_sharding, None))
  score = jax.jit(
      lambda params, batch, key, temperature: model.score_batch(
          params, batch, key, num_samples=num_samples, calibration_temperature=temperature),
      in_shardings=(shardings, batch_sharding, None, None))
  decode_alone = jax.jit(
      lambda params, batch, key, index: model.predict_batch_with_aux(
          params, batch, key, sample_index=index, **decode_kwargs)[0],
      in_shardings=(shardings, batch_sharding, None, None))
  return decode, score, decode_alone


def decode_and_score(model: BaseModel, params: Any, input_batches: Iterable[np.ndarray],
                     partitioner: Partitioner, predictive: Predictive, rng: jax.Array,
                     max_length: int, eos_id: int, sample_agreement: bool = False,
                     outputs: Sequence[Sequence[int]] | None = None,
                     beam_measures: bool = False, equivalence_samples: int = 0,
                     samples: Sequence[Sequence[Sequence[int]]] | None = None,
                     done: Sequence[Sequence[Decoded]] = (),
                     on_batch: Callable[[int, list[Decoded]], None] | None = None,
                     **decode_kwargs: Any) -> list[Decoded]:
  """Decodes each row of ``input_batches`` (``(batch, input length)`` token ids, all-zero
  rows skipped) and scores the outputs under the same predictive distribution: for a
  model average, under the very weight samples that decoded them.

  Args:
    model: the model.
    params: its parameters, sharded for ``partitioner``.
    input_batches: encoder input tokens, a global batch each.
    partitioner: mesh and rules.
    predictive: decode and score with the posterior mean or a model average.
    rng: key of weight samples and sampling.
    max_length: most output tokens, EOS included.
    eos_id: end of sequence.
    sample_agreement: for a model average, also decode with each of its ``S``
      samples alone and add ``bleu_disagreement``: 100 minus the mean sentence BLEU
      between the samples' outputs over ordered pairs (Malinin and Gales's "BLEU
      variance"; token ids as words). ``S`` more decodes.
    outputs: score these outputs (one per non-empty row, without EOS) instead of
      decoding: a temperature-scaled predictive scores what its unscaled self decoded.
    beam_measures: decoding by beam search (else a ValueError), also score each beam
      hypothesis under the same weight samples and add ``predictive.BEAM_MEASURES``
      (``beam_size - 1`` more scoring passes); for one model (the posterior mean)
      ``beam_total_uncertainty`` alone. Not added when ``outputs`` are given.
    equivalence_samples: ``K`` (0: none): also draw ``K`` ancestral samples of each
      input (temperature 1, no filtering; a key apart from the decode's) and score each
      as the output is scored (the same weight samples, dropout masks and temperature)
      into each record's ``samples`` and ``sample_log_probs``. Cost per batch: a sampled
      decode of ``K`` rows per input and ``K`` scoring passes.
    samples: with ``outputs`` and ``equivalence_samples``, score these samples (``K``
      per non-empty row, without EOS) instead of drawing them (a temperature-scaled
      predictive rescores its unscaled self's).
    done: the records of the first ``len(done)`` batches of an interrupted call with
      the same arguments, taken as they are; later batches keep their keys, so the
      result is the uninterrupted call's.
    on_batch: ``on_batch(index, records)`` as each batch's records are complete (to
      save them: ``evaluation.resumable``).
    **decode_kwargs: ``predict_batch_with_aux`` options (``method``, ``beam_size``).

  Returns:
    One record per non-empty input row, in order.
  """
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  decode, score, decode_alone = _programs(
      model, predictive.num_samples, max_length, _decode_items(decode_kwargs),
      jax.tree.structure(param_shardings), tuple(jax.tree.leaves(param_shardings)),
      _batch_sharding(partitioner))
  _check_options(decode_kwargs.get("method", "beam"), beam_measures, equivalence_samples,
                 samples is not None, outputs is not None)
  if equivalence_samples and samples is None:  # the ancestral sampler, compiled once per K
    sample = _programs(
        model, predictive.num_samples, max_length,
        _decode_items(dict(_ANCESTRAL, num_decodes=equivalence_samples)),
        jax.tree.structure(param_shardings), tuple(jax.tree.leaves(param_shardings)),
        _batch_sharding(partitioner))[0]
  num_samples = predictive.num_samples if sample_agreement else 0
  with_beam = beam_measures and outputs is None
  given = None if outputs is None else iter(outputs)
  given_samples = None if samples is None else iter(samples)
  records = []
  with partitioner.activation_rules():
    for i, inputs in enumerate(input_batches):
      if i < len(done):
        records.extend(done[i])
        for iterator in (given, given_samples):
          if iterator is not None:
            for _ in done[i]:
              next(iterator)
        continue
      key = jax.random.fold_in(rng, i)  # decode and score under the same weight samples
      present = np.flatnonzero(inputs.any(-1))
      if given is None:
        tokens, decoded_aux = decode(
            params, partitioner.global_batch({"encoder_input_tokens": inputs}), key)
        decoded = [until_eos(row, eos_id) for row in jax.device_get(tokens)]
      else:
        decoded = [[] for _ in range(len(inputs))]
        for row in present:
          decoded[row] = list(next(given))
      # Every scoring of this batch's rows: the outputs, beam hypotheses, samples.
      rescore = lambda rows: jax.device_get(score(params, partitioner.global_batch(rows), key,
                                                  np.float32(predictive.temperature)))
      batch = dict(_as_targets(decoded, max_length, eos_id), encoder_input_tokens=inputs)
      log_probs, aux = rescore(batch)
      counts = batch["decoder_loss_weights"].sum(-1)
      measures = _measures(log_probs, aux, counts)
      row_samples, sample_log_probs = [()] * len(inputs), None
      if equivalence_samples:
        if given_samples is None:
          drawn = sample(params, partitioner.global_batch({"encoder_input_tokens": inputs}),
                         jax.random.fold_in(key, _EQUIVALENCE_STREAM))[1]["all_sequences"]
          row_samples = [[until_eos(ids, eos_id) for ids in row] for row in jax.device_get(drawn)]
        else:
          row_samples = [[[]] * equivalence_samples for _ in range(len(inputs))]
          for row in present:
            row_samples[row] = [list(ids) for ids in next(given_samples)]
        sample_log_probs = _sample_log_probs(lambda rows: rescore(rows)[0], inputs,
                                             row_samples, equivalence_samples, max_length,
                                             eos_id)
      if with_beam:
        sequences = jax.device_get(decoded_aux["all_sequences"])
        if predictive.num_samples > 1:
          measures.update(_beam_measures(lambda rows: rescore(rows)[1]["sample_log_probs"],
                                         inputs, sequences, aux["sample_log_probs"], counts,
                                         max_length, eos_id))
        else:  # one model: only the total uncertainty has a meaning
          measures["beam_total_uncertainty"] = _beam_measures(
              lambda rows: rescore(rows)[0][None], inputs, sequences, log_probs[None], counts,
              max_length, eos_id)["beam_total_uncertainty"]
      if num_samples > 1:
        measures["bleu_disagreement"] = _bleu_disagreement(
            lambda s: decode_alone(params, partitioner.global_batch(
                {"encoder_input_tokens": inputs}), key, s), num_samples, len(inputs), eos_id)
      batch_records = _records(present, decoded, log_probs, counts, measures,
                               aux["token_log_probs"], row_samples, sample_log_probs)
      records.extend(batch_records)
      if on_batch is not None:
        on_batch(i, batch_records)
  return records


def _records(present: np.ndarray, decoded: Sequence[Sequence[int]], log_probs: np.ndarray,
             counts: np.ndarray, measures: Mapping[str, np.ndarray],
             token_log_probs: np.ndarray, row_samples: Sequence[Sequence[Sequence[int]]],
             sample_log_probs: np.ndarray | None) -> list[Decoded]:
  """One batch's ``Decoded`` records, one per present row."""
  records = []
  for row in present:
    row_measures = {name: float(value[row]) for name, value in measures.items()}
    records.append(Decoded(
        tuple(decoded[row]), float(log_probs[row]), int(counts[row]),
        row_measures["total_uncertainty"], row_measures.get("mutual_information", 0.0),
        row_measures, tuple(map(float, token_log_probs[row, :counts[row]])),
        tuple(map(tuple, row_samples[row])),
        () if sample_log_probs is None else tuple(map(float, sample_log_probs[row]))))
  return records


def _bleu_disagreement(decode_alone: Callable[[int], jax.Array], num_samples: int,
                       num_rows: int, eos_id: int) -> np.ndarray:
  """``(batch,)`` 100 minus the pairwise BLEU of the outputs each of the ``num_samples``
  weight samples decodes alone (``decode_alone(s)``: sample ``s``'s tokens)."""
  each = [[until_eos(row, eos_id) for row in jax.device_get(decode_alone(s))]
          for s in range(num_samples)]
  return 100.0 - np.array([pairwise_bleu([alone[row] for alone in each])
                           for row in range(num_rows)])


def _check_options(method: str, beam_measures: bool, equivalence_samples: int,
                   samples_given: bool, outputs_given: bool) -> None:
  """``decode_and_score``'s options that go together, or one ValueError line."""
  if beam_measures and method != "beam":
    raise ValueError(f"decode_and_score: beam_measures=True needs method='beam', not "
                     f"{method!r}")
  if not 0 <= equivalence_samples <= equivalence.MAX_SAMPLES:
    raise ValueError(f"decode_and_score: equivalence_samples={equivalence_samples!r} must be "
                     f"from 0 to {equivalence.MAX_SAMPLES}")
  if samples_given and not outputs_given:
    raise ValueError("decode_and_score: samples are rescored only with the outputs they "
                     "were drawn with; pass outputs too")


def _sample_log_probs(score_rows: Callable[[Batch], np.ndarray], inputs: np.ndarray,
                      row_samples: Sequence[Sequence[Sequence[int]]], num_samples: int,
                      max_length: int, eos_id: int) -> np.ndarray:
  """``(batch, K)`` log-probabilities of each row's ``K`` samples (without EOS).

  Sample ``k`` of every row is scored as one batch (``score_rows``: a teacher-forcing
  batch to ``(batch,)`` log-probabilities), as ``_beam_measures`` scores beam positions:
  each sample gets its input's weight samples and dropout masks. A sample cut at
  ``max_length`` without EOS is scored without it, as a decoded output is.

  Raises:
    ValueError: a row without ``num_samples`` samples (given ones, to rescore).
  """
  for row, drawn in enumerate(row_samples):
    if len(drawn) != num_samples:
      raise ValueError(f"decode_and_score: row {row} has {len(drawn)} samples, not "
                       f"equivalence_samples={num_samples}")
  return np.stack([np.asarray(score_rows(dict(
      _as_targets([list(drawn[k]) for drawn in row_samples], max_length, eos_id),
      encoder_input_tokens=inputs))) for k in range(num_samples)], -1)


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


def _beam_measures(score_rows: Callable[[Batch], np.ndarray], inputs: np.ndarray,
                   sequences: np.ndarray, best_log_probs: np.ndarray, best_counts: np.ndarray,
                   max_length: int, eos_id: int) -> dict[str, np.ndarray]:
  """``predictive.beam_sequence_measures`` of each row's beam.

  Beam position ``b`` of every row is scored as one batch (``score_rows``: a teacher-
  forcing batch to ``(S, batch)`` sample log-probabilities), so each scoring runs the
  compiled program of the decoded outputs on the same rows: a hypothesis gets its input's
  weight samples and MC dropout masks. Position 0, the decoded output, is given
  (``best_log_probs``, ``best_counts``). A hypothesis cut at ``max_length`` without EOS is
  scored without it, as the decoded output is; absent ones (``beam_hypotheses``) are
  left out.
  """
  outputs, present = beam_hypotheses(sequences, eos_id)
  log_probs, lengths = [np.asarray(best_log_probs)], [np.asarray(best_counts)]
  for b in range(1, sequences.shape[1]):
    batch = dict(_as_targets([row[b] for row in outputs], max_length, eos_id),
                 encoder_input_tokens=inputs)
    log_probs.append(np.asarray(score_rows(batch)))
    lengths.append(batch["decoder_loss_weights"].sum(-1))
  sample_log_probs = np.where(present, np.stack(log_probs, -1), -np.inf)
  return {name: np.asarray(value) for name, value in predictive.beam_sequence_measures(
      sample_log_probs, np.stack(lengths, -1)).items()}


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


def _measures(log_probs: np.ndarray, aux: Mapping[str, np.ndarray], counts: np.ndarray
              ) -> dict[str, np.ndarray]:
  """Each output's uncertainty measures from ``score_batch``'s ``aux`` (``(batch,)`` each)."""
  n = np.maximum(counts, 1)
  measures = {"total_uncertainty": aux["token_entropy"].sum(-1) / n}
  for name in predictive.TOKEN_MEASURES[1:]:
    if f"token_{name}" in aux:
      measures[name] = aux[f"token_{name}"].sum(-1) / n
  if "sample_log_probs" in aux:
    measures.update({name: np.asarray(value) for name, value in predictive.sequence_measures(
        aux["sample_log_probs"], counts).items()})
  else:  # one model: its sequence-level total uncertainty is its own -log P(y | x) / L
    measures["sequence_total_uncertainty"] = -log_probs / n
  return measures
