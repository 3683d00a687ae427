"""The Transformer behind the trainer's interface: ELBO loss, evaluation, scoring, decoding.

Batches follow T5X: ``encoder_input_tokens``, ``decoder_input_tokens`` (the targets shifted
right), ``decoder_target_tokens``, ``decoder_loss_weights``; 0 is padding and BOS. Bayesian
predictions use the posterior mean (one pass) or average the next-token distributions of
``S`` weight samples, each held fixed over a whole sequence (``layers.sample_weights``), so
beam search and sampling run over the predictive; each step reports the mutual information.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from meshbayes import predictive
from meshbayes.layers import KL_COLLECTION, as_posterior, kl_penalty, total_kl
from meshbayes.models import decoding
from meshbayes.models.base import (
  LOSS,
  NUM_LOSS_UNITS,
  BaseModel,
  Batch,
  Metrics,
  Sums,
  per_loss_unit,
)
from meshbayes.models.transformer import Transformer, TransformerConfig

Array = jax.Array

LOSS_NORMALIZATIONS = ("tokens", "examples")
DECODE_WEIGHTS = ("stored", "regenerated")
# fold_in data of the decoder's own randomness (sampling), apart from the weight samples.
_DECODE_STREAM = 0x5EED


def cross_entropy(logits: Array, targets: Array, label_smoothing: float = 0.0
                  ) -> tuple[Array, Array, Array]:
  """Token cross-entropy, optionally label-smoothed, and the log-partition.

  Returns:
    ``(loss, nll, log_z)`` per token: ``loss`` uses smoothed targets and is 0
    at its minimum (the entropy of the smoothed target is subtracted, as T5X
    does); ``nll`` is the plain negative log-likelihood.
  """
  log_z = jax.nn.logsumexp(logits, axis=-1)
  log_probs = logits - log_z[..., None]
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  if not label_smoothing:
    return nll, nll, log_z
  vocab = logits.shape[-1]
  confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
  soft = jax.nn.one_hot(targets, vocab) * (confidence - low) + low
  entropy = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low + 1e-20))
  return -jnp.sum(soft * log_probs, axis=-1) - entropy, nll, log_z


@dataclasses.dataclass(frozen=True)
class EncoderDecoderModel(BaseModel):
  """The Transformer with the trainer's interface.

  Attributes:
    config: the network.
    num_train_units: size of the training set in the units the NLL is
      averaged over (target tokens or examples): the KL is divided by it
      (``meshbayes.data.train_set_size`` counts it).
    loss_normalization: ``tokens`` (mean NLL per target token) or ``examples``
      (per-sequence NLL averaged over sequences).
    label_smoothing: label smoothing of the training loss.
    weight_noise: train under the Bayesian layers' weight samples (the ELBO's Monte
      Carlo estimate). False trains at the posterior mean: the KL is then only a
      penalty, on the means the L2 of MAP under the prior (the control that
      separates the weight noise from the penalty); the posterior scales follow the
      KL alone and mean nothing.
    z_loss: weight of ``log(Z)^2``, which keeps the softmax normalizer near 1.
    eos_id: end-of-sequence id.
    decode_weights: how model-averaged decoding holds its ``S`` weight samples:
      ``stored`` draws each once and keeps all (``S`` copies of the weights,
      the samples run in parallel); ``regenerated`` redraws each sample from
      its key inside every decoding step, one sample at a time (one copy
      whatever ``S``, for a weight-sized normal per sample and token). Both
      decode the same samples.
  """

  config: TransformerConfig
  num_train_units: float
  loss_normalization: str = "tokens"
  label_smoothing: float = 0.0
  weight_noise: bool = True
  z_loss: float = 1e-4
  eos_id: int = 1
  decode_weights: str = "stored"

  def __post_init__(self):
    if self.decode_weights not in DECODE_WEIGHTS:
      raise ValueError(f"EncoderDecoderModel: decode_weights={self.decode_weights!r} must be "
                       f"one of {DECODE_WEIGHTS}")
    if self.loss_normalization not in LOSS_NORMALIZATIONS:
      raise ValueError(f"EncoderDecoderModel: loss_normalization={self.loss_normalization!r} "
                       f"must be one of {LOSS_NORMALIZATIONS}")
    if not self.num_train_units > 0:
      raise ValueError(f"EncoderDecoderModel: num_train_units={self.num_train_units!r} must be "
                       "the (positive) number of training tokens or examples")
    if not isinstance(self.weight_noise, bool):
      raise ValueError(f"EncoderDecoderModel: weight_noise={self.weight_noise!r} must be True "
                       "or False")
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ValueError(f"EncoderDecoderModel: label_smoothing={self.label_smoothing!r} must be "
                       "in [0, 1)")

  @property
  def is_bayesian(self) -> bool:
    return self.config.estimators.is_bayesian

  @property
  def module(self) -> Transformer:
    """The network with its training estimators."""
    return Transformer(self.config)

  def get_initial_variables(self, rng, input_shapes):
    tokens = lambda name: jnp.ones(input_shapes[name], jnp.int32)
    return self.module.init(rng, tokens("encoder_input_tokens"),
                            tokens("decoder_input_tokens"), tokens("decoder_target_tokens"))

  def _sums(self, logits: Array, kl: Array, batch: Batch, kl_weight: float | Array,
            label_smoothing: float) -> Sums:
    """The batch's loss and metric sums; each loss unit carries the KL term once."""
    targets = batch["decoder_target_tokens"]
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    loss, nll, log_z = cross_entropy(logits, targets, label_smoothing)
    num_tokens = jnp.sum(weights)
    num_examples = jnp.asarray(targets.shape[0], jnp.float32)
    units = num_tokens if self.loss_normalization == "tokens" else num_examples
    z_loss = self.z_loss * jnp.sum(jnp.square(log_z) * weights)
    kl_weight = jnp.asarray(kl_weight, jnp.float32)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return {LOSS: jnp.sum(loss * weights) + z_loss
                  + units * kl_penalty(kl, self.num_train_units, kl_weight),
            "nll": jnp.sum(nll * weights), "z_loss": z_loss,
            # Once per step: summed once per example, so any split of the batch averages them.
            "kl": kl * num_examples, "kl_weight": kl_weight * num_examples,
            "correct": jnp.sum(correct * weights), "num_tokens": num_tokens,
            "num_examples": num_examples, NUM_LOSS_UNITS: units}

  def metrics_from_sums(self, sums: Sums) -> Metrics:
    per_unit = lambda name: per_loss_unit(sums[name], sums)
    per_example = lambda name: sums[name] / sums["num_examples"]
    nll, kl, kl_weight = per_unit("nll"), per_example("kl"), per_example("kl_weight")
    return {LOSS: per_unit(LOSS), "nll": nll, "kl": kl,
            "kl_term": kl_penalty(kl, self.num_train_units, kl_weight),
            "neg_elbo": nll + kl / self.num_train_units, "kl_weight": kl_weight,
            "z_loss": per_unit("z_loss"),
            "accuracy": sums["correct"] / jnp.maximum(sums["num_tokens"], 1.0),
            "num_tokens": sums["num_tokens"]}

  def _teacher_forced(self, params, batch, **kwargs):
    return self.module.apply({"params": params}, batch["encoder_input_tokens"],
                             batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                             mutable=[KL_COLLECTION], **kwargs)

  def loss_sums(self, params, batch, rng, kl_weight=1.0):
    dropout_rng, sample_rng = jax.random.split(rng)
    logits, state = self._teacher_forced(params, batch, enable_dropout=True,
                                         deterministic=not self.weight_noise,
                                         rngs={"dropout": dropout_rng, "sample": sample_rng})
    return self._sums(logits, total_kl(state), batch, kl_weight, self.label_smoothing)

  def eval_fn(self, params, batch, rng=None, num_samples=0):
    """Teacher-forced metrics at the posterior mean and, with ``num_samples``, the ELBO.

    ``nll`` and ``accuracy`` are the posterior mean's; ``plugin_neg_elbo`` is
    its NLL plus the KL per target token, a plug-in value, not the ELBO. With
    ``num_samples=S`` and a posterior (Bayesian layers or a ``WeightPosterior``),
    ``sampled_nll`` averages the NLL over ``S`` weight samples (``sample_weights``:
    one sample per call, so each sequence sees one set of weights, as prediction
    does) and, with Bayesian layers, ``neg_elbo = sampled_nll + KL / num_train_units``:
    the Monte Carlo negative ELBO per target token (IVON's KL is not the layers'
    and is not reported). The loss returned is the plug-in value.
    """
    posterior = as_posterior(params)
    logits, state = self._teacher_forced(posterior.mean_weights(), batch, deterministic=True)
    sums = self._sums(logits, total_kl(state), batch, 1.0, 0.0)
    metrics = self.metrics_from_sums(sums)
    metrics["plugin_neg_elbo"] = metrics.pop("neg_elbo")
    keys, mean = self._sample_keys(posterior, rng, num_samples)
    if not mean:
      def sampled_nll(total, key):
        logits, _ = self._teacher_forced(posterior.sample(key), batch, deterministic=True,
                                         **posterior.apply_options(key))
        return total + self._sums(logits, jnp.zeros(()), batch, 1.0, 0.0)["nll"], None

      nll_sum = jax.lax.scan(sampled_nll, jnp.zeros((), jnp.float32), keys)[0] / len(keys)
      metrics["sampled_nll"] = per_loss_unit(nll_sum, sums)
      if self.is_bayesian:  # a WeightPosterior's KL lives with its optimizer, not here
        metrics["neg_elbo"] = metrics["sampled_nll"] + metrics["kl"] / self.num_train_units
    return metrics[LOSS], metrics

  def _sample_keys(self, posterior: Any, rng: Array | None, num_samples: int
                   ) -> tuple[Array, bool]:
    """Keys of the posterior's members (``Posterior.member_keys``), and whether to use
    the posterior mean instead."""
    if num_samples == 0 or not (self.is_bayesian or posterior.external):
      return jax.random.key(0)[None], True
    return posterior.member_keys(rng, num_samples), False

  def score_batch(self, params, batch, rng=None, num_samples=0, return_log_probs=False,
                  calibration_temperature=1.0):
    """Target log-probabilities under the posterior mean or the model average.

    ``calibration_temperature`` ``T`` rescales the predictive distribution,
    ``p^(1/T)`` renormalized (temperature scaling: ``evaluation.predictives.fit_temperature``).

    The ``S`` weight samples run one after another, so memory holds one
    forward pass whatever ``S``.

    Returns:
      ``(sequence_log_probs (batch,), aux)`` with ``token_log_probs`` and
      ``token_entropy`` (of the predictive distribution: the total uncertainty)
      and, for ``num_samples > 0``, ``token_<name>`` for the other measures of
      ``predictive.TOKEN_MEASURES`` (all ``(batch, length)``, 0 at padding) and
      ``sample_log_probs`` ``(S, batch)``, each weight sample's log-probability
      of the targets; with ``return_log_probs``, also ``log_probs``
      ``(batch, length, vocab)``, the whole predictive distribution.
    """
    posterior = as_posterior(params)
    keys, mean = self._sample_keys(posterior, rng, num_samples)

    def log_probs(key):
      weights = posterior.mean_weights() if mean else posterior.sample(key)
      logits = self.module.apply({"params": weights}, batch["encoder_input_tokens"],
                                 batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                                 deterministic=True,
                                 **({} if mean else posterior.apply_options(key)))
      return jax.nn.log_softmax(logits.astype(jnp.float32))

    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    targets = batch["decoder_target_tokens"]
    average, measures, picked = predictive.streaming_token_measures(log_probs, keys, targets)
    if not isinstance(calibration_temperature, (int, float)) or calibration_temperature != 1.0:
      # T may be traced; at T = 1 the predictive stays as it is, to the last bit.
      unscaled = calibration_temperature == 1.0
      average = jnp.where(unscaled, average,
                          jax.nn.log_softmax(average / calibration_temperature))
      measures["total_uncertainty"] = jnp.where(unscaled, measures["total_uncertainty"],
                                                predictive.entropy(average))
    token_log_probs = jnp.take_along_axis(average, targets[..., None], -1)[..., 0] * weights
    aux = {"token_log_probs": token_log_probs,
           "token_entropy": measures["total_uncertainty"] * weights}
    if not mean:
      aux.update({f"token_{name}": value * weights for name, value in measures.items()
                  if name != "total_uncertainty"})
      aux["sample_log_probs"] = jnp.sum(picked * weights, -1)
    if return_log_probs:
      aux["log_probs"] = average
    return token_log_probs.sum(-1), aux

  def predict_batch_with_aux(self, params, batch, rng=None, *, method: str = "beam",
                             beam_size: int = 4, alpha: float = 0.6, num_decodes: int = 1,
                             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                             num_samples: int = 0, max_length: int | None = None,
                             sample_index: int | Array | None = None):
    """Decodes the inputs.

    Args:
      params: the parameters.
      batch: needs ``encoder_input_tokens``; ``decoder_target_tokens`` sets the
        default ``max_length``.
      rng: PRNG key (sampling, and weight samples when ``num_samples > 0``: the
        same samples as ``score_batch`` with this ``rng``).
      method: ``beam``, ``greedy`` or ``sample``.
      beam_size: beams (``beam``).
      alpha: length penalty exponent (``beam``).
      num_decodes: samples per input (``sample``).
      temperature: softmax temperature (``sample``).
      top_k: top-k filtering (``sample``).
      top_p: nucleus filtering (``sample``).
      num_samples: 0 decodes with the posterior mean; ``S > 0`` averages ``S``
        weight samples at every step (Bayesian model averaging).
      max_length: most tokens to emit, EOS included.
      sample_index: decode with weight sample ``sample_index`` alone, of the
        ``num_samples`` this ``rng`` defines (an ``Ensemble``: that member).

    Returns:
      ``(tokens (batch, length), aux)``: the best decode, and ``aux`` with
      ``scores``, ``token_log_probs``, ``all_sequences``, ``all_scores`` and,
      for ``num_samples > 0``, ``token_mutual_information``.
    """
    if method not in ("beam", "greedy", "sample"):
      raise ValueError(f"predict_batch_with_aux: method={method!r} must be beam, greedy or "
                       "sample")
    inputs = batch["encoder_input_tokens"]
    batch_size = inputs.shape[0]
    max_length = max_length or batch["decoder_target_tokens"].shape[-1]
    rng = jax.random.key(0) if rng is None else rng
    # The weight samples are score_batch's for the same rng; sampling's keys are apart.
    decode_rng = jax.random.fold_in(rng, _DECODE_STREAM)
    step_fn, reorder, cache = self.incremental_decoder(params, inputs, max_length, rng,
                                                       num_samples, sample_index)
    common = dict(batch_size=batch_size, max_length=max_length, eos_id=self.eos_id,
                  vocab_mask=jnp.arange(self.config.vocab_size) != 0)
    if method == "beam":
      result = decoding.beam_search(step_fn, reorder, cache, beam_size=beam_size, alpha=alpha,
                                    **common)
    else:
      result = decoding.sample(step_fn, reorder, cache, decode_rng,
                               num_decodes=1 if method == "greedy" else num_decodes,
                               temperature=0.0 if method == "greedy" else temperature,
                               top_k=top_k, top_p=top_p, **common)
    aux = {"scores": result.scores[:, 0], "token_log_probs": result.token_log_probs[:, 0],
           "all_sequences": result.sequences, "all_scores": result.scores}
    if "mutual_information" in result.aux:
      aux["token_mutual_information"] = result.aux["mutual_information"][:, 0]
    return result.sequences[:, 0], aux

  def incremental_decoder(self, params: Any, inputs: Array, max_length: int,
                          rng: Array | None = None, num_samples: int = 0,
                          sample_index: int | Array | None = None):
    """The step function, cache reordering and initial cache for ``models.decoding``.

    Args:
      params: the parameters.
      inputs: ``(batch, input length)`` encoder input tokens.
      max_length: decoder positions to cache.
      rng: key of the weight samples (needed when ``num_samples > 0``).
      num_samples: 0 for the posterior mean, else ``S`` weight samples whose
        next-token distributions are averaged.
      sample_index: keep only this one of the weight samples.

    Returns:
      ``(step_fn, reorder, cache)``. The cache holds, for each weight sample
      (a leading axis), the encoder outputs and the decoder's key/value cache.
      Its rows may be several per input (beams, samples), input-major, as
      ``models.decoding`` expands them: MC dropout then holds each input's masks
      for all of its rows, so a hypothesis keeps its masks when beams are reordered.
    """
    posterior = as_posterior(params)
    keys, mean = self._sample_keys(posterior, rng, num_samples)
    if sample_index is not None and not mean:
      keys = keys[sample_index][None]
    num_samples = keys.shape[0]
    module = self.module
    if mean or self.decode_weights == "stored":
      # Each sample's weights are drawn once, here, and decoded at their "posterior mean";
      # only the drawn leaves are stacked (S copies), the rest shared.
      axis = None if mean else posterior.sampled_axes()
      weights = posterior.mean_weights() if mean else posterior.stacked(keys)
      # fn(weights, key, *args) over the samples: their weights and keys (MC dropout's rngs).
      per_sample = lambda fn, *axes: lambda weights, *args: jax.vmap(
          fn, in_axes=(axis, 0, *axes), axis_size=num_samples)(weights, keys, *args)
    else:  # "regenerated": one sample's weights at a time, drawn again at each step
      weights = None
      per_sample = lambda fn, *axes: lambda _, *args: jax.lax.map(
          lambda xs: fn(posterior.sample(xs[0]), *xs), (keys, *args))
    sample_rngs = (lambda key: {}) if mean else posterior.apply_options

    def encode(weights, key):
      return module.apply({"params": weights}, inputs, deterministic=True,
                          method=Transformer.encode, **sample_rngs(key))

    encoded = per_sample(encode)(weights)
    dummy = jnp.zeros((inputs.shape[0], max_length), jnp.int32)
    cache_shapes = jax.eval_shape(
        lambda: module.apply({"params": posterior.mean_weights()}, encoded[0], inputs, dummy,
                             deterministic=True,
                             decode=True, max_decode_length=max_length, mutable=["cache"],
                             method=Transformer.decode)[1]["cache"])
    decoder_cache = jax.tree.map(lambda s: jnp.zeros((num_samples,) + s.shape, s.dtype),
                                 cache_shapes)
    cache = {"decoder": decoder_cache, "encoded": encoded, "inputs": inputs}
    decoder_batch_axis = 2 if self.config.scan_layers else 1  # after (samples[, layers])

    batch_size = inputs.shape[0]
    # Dropout draws its mask from the key for the rows it is given: to give every row of an
    # input the same masks (those scoring draws for the input), the rows of one input are
    # decoded as copies of a batch of the inputs (vmap over copies, the key shared).
    masks_per_input = bool(sample_rngs(keys[0]))
    cache_batch_axis = decoder_batch_axis - 1  # inside one sample

    def decode_rows(weights, key, decoder_cache, encoded, encoder_inputs, tokens):
      logits, state = module.apply(
          {"params": weights, "cache": decoder_cache}, encoded, encoder_inputs,
          tokens[:, None], deterministic=True, decode=True, max_decode_length=max_length,
          mutable=["cache"], method=Transformer.decode, **sample_rngs(key))
      return jax.nn.log_softmax(logits[:, 0]), state["cache"]

    def step_fn(tokens, cache):
      copies = tokens.shape[0] // batch_size

      def one_sample(weights, key, decoder_cache, encoded):
        if not masks_per_input or copies == 1:
          return decode_rows(weights, key, decoder_cache, encoded, cache["inputs"], tokens)
        split = lambda x, axis: x.reshape(x.shape[:axis] + (batch_size, copies)
                                          + x.shape[axis + 1:])
        merge = lambda x, axis: x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])
        cache_axes = jax.tree.map(lambda x: cache_batch_axis + 1 if x.ndim > cache_batch_axis
                                  else None, decoder_cache)
        cache_split = jax.tree.map(lambda x, a: x if a is None else split(x, a - 1),
                                   decoder_cache, cache_axes)
        log_probs, new_cache = jax.vmap(
            functools.partial(decode_rows, weights, key), in_axes=(cache_axes, 1, 1, 1),
            out_axes=(1, cache_axes))(cache_split, split(encoded, 0), split(cache["inputs"], 0),
                                      split(tokens, 0))
        return merge(log_probs, 0), jax.tree.map(
            lambda x, a: x if a is None else merge(x, a - 1), new_cache, cache_axes)

      samples, decoder_cache = per_sample(one_sample, 0, 0)(weights, cache["decoder"],
                                                             cache["encoded"])
      aux = {} if mean else {"mutual_information": predictive.mutual_information(samples)}
      return predictive.model_average(samples), aux, dict(cache, decoder=decoder_cache)

    def reorder(cache, rows):
      def take(x, axis):
        return x if x.ndim <= axis else jnp.take(x, rows, axis=axis)
      return {"decoder": jax.tree.map(lambda x: take(x, decoder_batch_axis), cache["decoder"]),
              "encoded": take(cache["encoded"], 1), "inputs": take(cache["inputs"], 0)}

    return step_fn, reorder, cache
