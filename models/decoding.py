"""Autoregressive decoding: beam search and sampling, for any model.

The model provides ``step_fn(tokens, cache) -> (log_probs, aux, cache)``: from each of
``N`` rows' previous token, the normalized next-token log-probabilities ``(N, vocab)`` (a
Bayesian model's predictive) and ``aux``, name -> ``(N,)`` values recorded per step; and
``reorder(cache, indices) -> cache``, the rows ``indices``. Sequences start from token 0
(BOS, also padding), end with ``eos_id`` and are 0 after it; decoding jits (``lax.while_loop``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
StepFn = Callable[[Array, Any], tuple[Array, dict[str, Array], Any]]
ReorderFn = Callable[[Any, Array], Any]

_NEG_INF = -1.0e7


@dataclasses.dataclass(frozen=True)
class DecodeResult:
  """Decoded sequences, best first along axis 1.

  Attributes:
    sequences: ``(batch, num, length)`` token ids, 0 after EOS.
    scores: ``(batch, num)``: beam search's length-penalized log-probability,
      or for sampling the log-probability of the sequence.
    token_log_probs: ``(batch, num, length)`` log-probability of each emitted
      token under the model (0 after EOS).
    aux: name -> ``(batch, num, length)`` per-step values from ``step_fn``.
  """

  sequences: Array
  scores: Array
  token_log_probs: Array
  aux: dict[str, Array]


jax.tree_util.register_dataclass(DecodeResult, data_fields=["sequences", "scores",
                                                            "token_log_probs", "aux"],
                                 meta_fields=[])


def brevity_penalty(alpha: float, length: Array) -> Array:
  """GNMT's length penalty ``((5 + length) / 6) ** alpha``."""
  return ((5.0 + length) / 6.0) ** alpha


def _gather_beams(x: Array, beam_indices: Array) -> Array:
  """``x[b, beam_indices[b, k]]`` for ``(batch, beams, ...)`` arrays."""
  return jnp.take_along_axis(x, beam_indices.reshape(beam_indices.shape + (1,) * (x.ndim - 2)),
                             axis=1)


def _flat_rows(batch_size: int, num: int, beam_indices: Array) -> Array:
  return (jnp.arange(batch_size)[:, None] * num + beam_indices).reshape(-1)


def beam_search(step_fn: StepFn, reorder: ReorderFn, cache: Any, *, batch_size: int,
                beam_size: int, max_length: int, eos_id: int, alpha: float = 0.6,
                vocab_mask: Array | None = None) -> DecodeResult:
  """Beam search with a length penalty.

  Each step extends every live beam by every token: the ``beam_size`` best
  non-EOS extensions stay live, and every beam's EOS extension competes for a
  place among the ``beam_size`` best finished sequences, scored
  ``log p / brevity_penalty(alpha, length)`` (length counts EOS). It stops
  when no live beam can still beat the worst finished one, or at
  ``max_length``; a batch item with no finished sequence returns its live
  beams.

  Args:
    step_fn: the model's step (see the module docstring).
    reorder: the model's cache reordering.
    cache: the cache for ``batch_size`` rows.
    batch_size: number of inputs.
    beam_size: beams per input.
    max_length: maximum number of tokens, EOS included.
    eos_id: end-of-sequence id.
    alpha: length penalty exponent (0: none).
    vocab_mask: optional ``(vocab,)`` booleans of tokens that may be emitted.

  Returns:
    ``DecodeResult`` with ``beam_size`` sequences per input, best first.
  """
  b, k, length = batch_size, beam_size, max_length
  cache = reorder(cache, jnp.repeat(jnp.arange(b), k))
  # Only beam 0 is live at the start; the others would duplicate it.
  live_scores = jnp.where(jnp.arange(k)[None, :] == 0, 0.0, _NEG_INF) * jnp.ones((b, 1))
  zeros = jnp.zeros((b, k, length), jnp.int32)
  state = dict(
      step=jnp.zeros((), jnp.int32), cache=cache, live_scores=live_scores, live_seqs=zeros,
      live_token_log_probs=zeros.astype(jnp.float32), live_aux=None,
      finished_scores=jnp.full((b, k), _NEG_INF), finished_seqs=zeros,
      finished_token_log_probs=zeros.astype(jnp.float32), finished_aux=None)

  def step(state):
    i = state["step"]
    previous = jnp.where(i == 0, 0, lax.dynamic_index_in_dim(state["live_seqs"], i - 1, 2,
                                                             keepdims=False))
    log_probs, aux, cache = step_fn(previous.reshape(-1), state["cache"])
    vocab = log_probs.shape[-1]
    log_probs = log_probs.reshape(b, k, vocab)
    if vocab_mask is not None:
      log_probs = jnp.where(vocab_mask, log_probs, _NEG_INF)
    aux = {name: value.reshape(b, k) for name, value in aux.items()}
    candidates = state["live_scores"][..., None] + log_probs

    def extend(seqs, token_lps, aux_seqs, beams, tokens):
      """Beams ``beams`` of the live state, extended at step i by ``tokens``."""
      seqs = lax.dynamic_update_index_in_dim(_gather_beams(seqs, beams), tokens, i, 2)
      token_lp = jnp.take_along_axis(_gather_beams(log_probs, beams), tokens[..., None],
                                     axis=-1)[..., 0]
      token_lps = lax.dynamic_update_index_in_dim(_gather_beams(token_lps, beams), token_lp, i, 2)
      aux_seqs = {name: lax.dynamic_update_index_in_dim(
          _gather_beams(aux_seqs[name], beams), _gather_beams(aux[name], beams), i, 2)
                  for name in aux}
      return seqs, token_lps, aux_seqs

    live_aux = state["live_aux"] or {name: jnp.zeros((b, k, length)) for name in aux}
    finished_aux = state["finished_aux"] or {name: jnp.zeros((b, k, length)) for name in aux}

    # Finished candidates: every live beam followed by EOS.
    eos_scores = candidates[..., eos_id] / brevity_penalty(alpha, (i + 1).astype(jnp.float32))
    eos_seqs, eos_token_lps, eos_aux = extend(
        state["live_seqs"], state["live_token_log_probs"], live_aux,
        jnp.broadcast_to(jnp.arange(k), (b, k)), jnp.full((b, k), eos_id))
    pool = lambda old, new: jnp.concatenate([old, new], axis=1)
    all_scores = pool(state["finished_scores"], eos_scores)
    finished_scores, keep = lax.top_k(all_scores, k)
    finished_seqs = _gather_beams(pool(state["finished_seqs"], eos_seqs), keep)
    finished_token_lps = _gather_beams(pool(state["finished_token_log_probs"], eos_token_lps),
                                       keep)
    finished_aux = {name: _gather_beams(pool(finished_aux[name], eos_aux[name]), keep)
                    for name in aux}

    # Live candidates: the best non-EOS extensions.
    flat = candidates.at[..., eos_id].set(_NEG_INF).reshape(b, k * vocab)
    live_scores, choice = lax.top_k(flat, k)
    beams, tokens = choice // vocab, choice % vocab
    live_seqs, live_token_lps, live_aux = extend(state["live_seqs"], state["live_token_log_probs"],
                                                 live_aux, beams, tokens)
    return dict(step=i + 1, cache=reorder(cache, _flat_rows(b, k, beams)),
                live_scores=live_scores, live_seqs=live_seqs,
                live_token_log_probs=live_token_lps, live_aux=live_aux,
                finished_scores=finished_scores, finished_seqs=finished_seqs,
                finished_token_log_probs=finished_token_lps, finished_aux=finished_aux)

  def not_done(state):
    # Log-probabilities only fall, so a live beam's best possible final score is
    # its current one under the largest penalty.
    best_live = state["live_scores"][:, 0] / brevity_penalty(alpha, float(length))
    worst_finished = state["finished_scores"][:, -1]
    return (state["step"] < length) & jnp.any(best_live > worst_finished)

  state = step(state)  # the first step fixes the aux structure for the loop
  state = lax.while_loop(not_done, step, state)
  has_finished = state["finished_scores"][:, :1] > _NEG_INF / 2
  live_final = state["live_scores"] / brevity_penalty(alpha, float(length))
  pick = lambda finished, live: jnp.where(
      has_finished.reshape((b, 1) + (1,) * (finished.ndim - 2)), finished, live)
  return DecodeResult(
      sequences=pick(state["finished_seqs"], state["live_seqs"]),
      scores=pick(state["finished_scores"], live_final),
      token_log_probs=pick(state["finished_token_log_probs"], state["live_token_log_probs"]),
      aux={name: pick(state["finished_aux"][name], state["live_aux"][name])
           for name in state["finished_aux"]})


def _filter_logits(logits: Array, top_k: int, top_p: float) -> Array:
  """Keeps the ``top_k`` most likely tokens and the smallest set with mass ``top_p``."""
  if top_k:
    kth = lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, _NEG_INF, logits)
  if top_p < 1.0:
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    mass_before = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1) - jax.nn.softmax(
        sorted_logits, axis=-1)
    sorted_logits = jnp.where(mass_before < top_p, sorted_logits, _NEG_INF)
    logits = jnp.zeros_like(logits).at[
        jnp.arange(logits.shape[0])[:, None], order].set(sorted_logits)
  return logits


def sample(step_fn: StepFn, reorder: ReorderFn, cache: Any, rng: Array, *, batch_size: int,
           max_length: int, eos_id: int, num_decodes: int = 1, temperature: float = 1.0,
           top_k: int = 0, top_p: float = 1.0, vocab_mask: Array | None = None) -> DecodeResult:
  """Ancestral sampling with temperature, top-k and top-p (nucleus) filtering.

  ``temperature=0`` is greedy decoding. Scores and token log-probabilities are
  those of the model's own distribution, not the filtered one.

  Args:
    step_fn: the model's step.
    reorder: the model's cache reordering.
    cache: the cache for ``batch_size`` rows.
    rng: PRNG key.
    batch_size: number of inputs.
    max_length: maximum number of tokens, EOS included.
    eos_id: end-of-sequence id.
    num_decodes: samples per input.
    temperature: softmax temperature (0: argmax).
    top_k: keep only the ``top_k`` most likely tokens (0: all).
    top_p: keep the smallest set of tokens with this much probability (1: all).
    vocab_mask: optional ``(vocab,)`` booleans of tokens that may be emitted.

  Returns:
    ``DecodeResult`` with ``num_decodes`` sequences per input, best first.
  """
  if temperature < 0 or top_k < 0 or not 0.0 < top_p <= 1.0:
    raise ValueError(f"sample: temperature={temperature} must be >= 0, top_k={top_k} >= 0 and "
                     f"top_p={top_p} in (0, 1]")
  n = batch_size * num_decodes
  cache = reorder(cache, jnp.repeat(jnp.arange(batch_size), num_decodes))
  zeros = jnp.zeros((n, max_length), jnp.int32)

  def step(state):
    i = state["step"]
    previous = jnp.where(i == 0, 0, lax.dynamic_index_in_dim(state["seqs"], i - 1, 1,
                                                             keepdims=False))
    log_probs, aux, cache = step_fn(previous, state["cache"])
    logits = log_probs if vocab_mask is None else jnp.where(vocab_mask, log_probs, _NEG_INF)
    if temperature == 0:
      tokens = jnp.argmax(logits, axis=-1)
    else:
      logits = _filter_logits(logits / temperature, top_k, top_p)
      tokens = jax.random.categorical(jax.random.fold_in(rng, i), logits, axis=-1)
    alive = ~state["ended"]
    tokens = jnp.where(alive, tokens, 0).astype(jnp.int32)
    token_lp = jnp.where(alive, jnp.take_along_axis(log_probs, tokens[:, None], -1)[:, 0], 0.0)
    aux_seqs = state["aux"] or {name: jnp.zeros((n, max_length)) for name in aux}
    return dict(
        step=i + 1, cache=cache, ended=state["ended"] | (tokens == eos_id),
        seqs=lax.dynamic_update_index_in_dim(state["seqs"], tokens, i, 1),
        token_log_probs=lax.dynamic_update_index_in_dim(state["token_log_probs"], token_lp, i, 1),
        aux={name: lax.dynamic_update_index_in_dim(
            aux_seqs[name], jnp.where(alive, aux[name], 0.0), i, 1) for name in aux})

  state = dict(step=jnp.zeros((), jnp.int32), cache=cache, ended=jnp.zeros((n,), bool),
               seqs=zeros, token_log_probs=zeros.astype(jnp.float32), aux=None)
  state = step(state)
  state = lax.while_loop(lambda s: (s["step"] < max_length) & ~jnp.all(s["ended"]), step, state)
  scores = state["token_log_probs"].sum(-1).reshape(batch_size, num_decodes)
  order = jnp.argsort(-scores, axis=1)
  per_input = lambda x: _gather_beams(x.reshape((batch_size, num_decodes) + x.shape[1:]), order)
  return DecodeResult(sequences=per_input(state["seqs"]),
                      scores=jnp.take_along_axis(scores, order, axis=1),
                      token_log_probs=per_input(state["token_log_probs"]),
                      aux={name: per_input(v) for name, v in state["aux"].items()})
