"""Decoding: incremental logits against teacher forcing, beam search against brute force,
and sampling against the distribution it samples from."""

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import layers
from meshbayes.models import decoding
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import TransformerConfig
from meshbayes.models.transformer.config import Estimators
from tests.models.synthetic import make_batch

EOS = 1


class MarkovChain:
  """A toy model: the next token depends only on the previous one (table P).

  The cache holds each row's previous token, which checks that decoding
  reorders caches along with beams.
  """

  def __init__(self, vocab_size, seed=0):
    logits = jax.random.normal(jax.random.key(seed), (vocab_size, vocab_size)) * 2.0
    self.log_p = np.asarray(jax.nn.log_softmax(logits), np.float64)
    self.log_p_jnp = jax.nn.log_softmax(logits)

  def step_fn(self, tokens, cache):
    entropy = -jnp.sum(jnp.exp(self.log_p_jnp[tokens]) * self.log_p_jnp[tokens], -1)
    return self.log_p_jnp[tokens], {"entropy": entropy}, {"previous": tokens, "rows": cache["rows"]}

  @staticmethod
  def reorder(cache, rows):
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), cache)

  def sequence_log_prob(self, seq):
    previous, total = 0, 0.0
    for token in seq:
      total += self.log_p[previous, token]
      previous = token
    return total


def brute_force(chain, vocab_size, max_length, alpha):
  """Every EOS-terminated sequence of tokens 1..V-1, scored as beam search scores."""
  scored = []
  for n in range(1, max_length + 1):
    for body in itertools.product(range(2, vocab_size), repeat=n - 1):
      seq = body + (EOS,)
      scored.append((chain.sequence_log_prob(seq) / ((5 + n) / 6) ** alpha, seq))
  return sorted(scored, reverse=True)


@pytest.mark.parametrize("max_length, beam_size", [(2, 5), (3, 25)])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_exhaustive_beam_search_finds_the_brute_force_best(max_length, beam_size, alpha):
  vocab = 5
  chain = MarkovChain(vocab)
  cache = {"previous": jnp.zeros(3, jnp.int32), "rows": jnp.arange(3)}
  result = jax.jit(lambda: decoding.beam_search(
      chain.step_fn, chain.reorder, cache, batch_size=3, beam_size=beam_size,
      max_length=max_length, eos_id=EOS, alpha=alpha,
      vocab_mask=jnp.arange(vocab) != 0))()
  expected = brute_force(chain, vocab, max_length, alpha)
  for b in range(3):  # three identical inputs: identical results
    best = tuple(int(t) for t in result.sequences[b, 0] if t)
    assert best == expected[0][1]
    np.testing.assert_allclose(result.scores[b, 0], expected[0][0], rtol=1e-5)
    # Exhaustive: the returned beams are the brute-force top sequences, in order.
    top = min(beam_size, len(expected))
    np.testing.assert_allclose(result.scores[b, :top], [s for s, _ in expected[:top]], rtol=1e-5)
    np.testing.assert_allclose(result.token_log_probs[b, 0].sum(),
                               chain.sequence_log_prob(best), rtol=1e-5)
  assert result.aux["entropy"].shape == (3, beam_size, max_length)


def test_greedy_top_k_and_top_p_follow_the_argmax_chain():
  chain = MarkovChain(6, seed=1)
  cache = {"previous": jnp.zeros(2, jnp.int32), "rows": jnp.arange(2)}
  common = dict(batch_size=2, max_length=5, eos_id=EOS, vocab_mask=jnp.arange(6) != 0)
  greedy = decoding.sample(chain.step_fn, chain.reorder, cache, jax.random.key(0),
                           temperature=0.0, **common)
  expected, previous = [], 0
  for _ in range(5):
    previous = int(np.argmax(np.where(np.arange(6) != 0, chain.log_p[previous], -np.inf)))
    expected.append(previous)
    if previous == EOS:
      break
  expected += [0] * (5 - len(expected))
  np.testing.assert_array_equal(greedy.sequences[:, 0], [expected, expected])
  for kwargs in (dict(top_k=1), dict(top_p=1e-6)):
    filtered = decoding.sample(chain.step_fn, chain.reorder, cache, jax.random.key(3), **kwargs,
                               **common)
    np.testing.assert_array_equal(filtered.sequences, greedy.sequences)


def test_sampling_draws_from_the_model_distribution():
  chain = MarkovChain(6, seed=2)
  cache = {"previous": jnp.zeros(1, jnp.int32), "rows": jnp.arange(1)}
  n = 20_000
  result = decoding.sample(chain.step_fn, chain.reorder, cache, jax.random.key(0), batch_size=1,
                           max_length=2, eos_id=EOS, num_decodes=n)
  first = np.asarray(result.sequences[0, :, 0])
  p = np.exp(chain.log_p[0])
  frequency = np.bincount(first, minlength=6) / n
  assert np.all(np.abs(frequency - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1e-9), (frequency, p)
  # Scores are the model's log-probabilities of what was emitted, best first.
  seqs = np.asarray(result.sequences[0])
  expected = [chain.sequence_log_prob([t for t in s if t]) for s in seqs[:50]]
  np.testing.assert_allclose(result.scores[0, :50], expected, rtol=1e-5)
  assert np.all(np.diff(np.asarray(result.scores[0])) <= 0)
  with pytest.raises(ValueError, match="top_p=0.0 in"):
    decoding.sample(chain.step_fn, chain.reorder, cache, jax.random.key(0), batch_size=1,
                    max_length=2, eos_id=EOS, top_p=0.0)


TINY = TransformerConfig(vocab_size=6, emb_dim=16, num_heads=2, head_dim=8,
                         num_encoder_layers=2, num_decoder_layers=2, mlp_dim=32,
                         dropout_rate=0.0)


def tiny_model(**config):
  model = EncoderDecoderModel(TINY.replace(**config), num_train_units=1000)
  batch = {k: jnp.asarray(v) for k, v in
           make_batch(np.random.default_rng(0), 2, 6, TINY.vocab_size).items()}
  shapes = {k: v.shape for k, v in batch.items()}
  params = jax.jit(lambda k: nn.unbox(model.get_initial_variables(k, shapes)["params"]))(
      jax.random.key(0))
  return model, params, batch


def jitted(fn, **static):
  return jax.jit(functools.partial(fn, **static))


@pytest.mark.parametrize("scan_layers", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("num_samples", [0, 1])
def test_incremental_logits_equal_teacher_forced_logits(scan_layers, num_samples):
  """Posterior mean (num_samples=0) and one fixed weight sample (num_samples=1)."""
  model, params, batch = tiny_model(scan_layers=scan_layers)
  rng = jax.random.key(7)
  inputs = batch["encoder_input_tokens"]
  decoder = lambda: model.incremental_decoder(params, inputs, 6, rng, num_samples)
  cache = jax.jit(lambda: decoder()[2])()
  step_fn = jax.jit(lambda tokens, cache: decoder()[0](tokens, cache))
  key = jax.random.split(rng, 1)[0]  # the weight sample's key, as incremental_decoder draws it
  weights = lambda p: p if num_samples == 0 else layers.sample_weights(p, key)
  teacher_forced = jax.jit(lambda p, b: jax.nn.log_softmax(model.module.apply(
      {"params": weights(p)}, b["encoder_input_tokens"], b["decoder_input_tokens"],
      b["decoder_target_tokens"], deterministic=True)))(params, batch)
  valid = np.asarray(batch["decoder_loss_weights"]) > 0
  for i in range(6):
    log_probs, _, cache = step_fn(batch["decoder_input_tokens"][:, i], cache)
    np.testing.assert_allclose(np.asarray(log_probs)[valid[:, i]],
                               np.asarray(teacher_forced[:, i])[valid[:, i]], atol=2e-5)


CANDIDATES = [(EOS, 0)] + [(a, EOS) for a in range(2, 6)]  # every output of up to 2 tokens


def brute_force_scores(model, params, inputs, rng, num_samples):
  """``(rows, 5)`` length-penalized scores of every candidate for each row of ``inputs``,
  from ``score_batch`` under ``rng``: all rows scored together, so each keeps its own
  weight samples or dropout masks."""
  rows = inputs.shape[0]
  score = jitted(model.score_batch, num_samples=num_samples)  # one program for every candidate
  log_probs = []
  for candidate in CANDIDATES:
    targets = jnp.asarray([candidate] * rows, jnp.int32)
    scoring = dict(encoder_input_tokens=inputs, decoder_target_tokens=targets,
                   decoder_input_tokens=jnp.pad(targets[:, :1], [(0, 0), (1, 0)]),
                   decoder_loss_weights=(targets > 0).astype(jnp.float32))
    log_probs.append(score(params, scoring, rng)[0])
  lengths = np.array([1, 2, 2, 2, 2])
  return np.stack(log_probs, 1) / ((5 + lengths) / 6) ** 0.6


# make test keeps the model average (3 samples); the posterior mean's search is the same code.
@pytest.mark.parametrize("num_samples", [pytest.param(0, marks=pytest.mark.slow), 3])
def test_transformer_beam_search_is_exact_when_exhaustive(num_samples):
  """Vocabulary of 6 (4 free tokens, EOS, padding), up to 2 tokens, beam 6: every
  sequence is considered, so beam search returns the brute-force best under
  the posterior mean or the 3-sample model average, and its score is the one
  ``score_batch`` gives that output under the same rng (the same weight samples)."""
  model, params, batch = tiny_model()
  batch = {k: v[:1] for k, v in batch.items()}
  rng = jax.random.key(11)
  tokens, aux = jitted(model.predict_batch_with_aux, method="beam", beam_size=6, alpha=0.6,
                       num_samples=num_samples, max_length=2)(params, batch, rng)
  # Scored with the decode's own rng: the same weight samples that searched.
  scores = brute_force_scores(model, params, batch["encoder_input_tokens"], rng, num_samples)[0]
  best = int(np.argmax(scores))
  np.testing.assert_array_equal(tokens[0], CANDIDATES[best])
  np.testing.assert_allclose(aux["scores"][0], scores[best], rtol=1e-5)
  if num_samples:
    assert aux["token_mutual_information"].shape == (1, 2)
    assert float(aux["token_mutual_information"][0, 0]) > 0


@pytest.mark.parametrize("num_samples", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_mc_dropout_beam_search_holds_each_sentences_masks_for_all_its_beams(num_samples):
  """MC dropout (dropout 0.3) with S masks per sentence, two sentences, exhaustive beams:
  every finished hypothesis of each sentence scores what the model with that sentence's
  masks frozen gives it (``score_batch`` of the two sentences together, one candidate at
  a time), so the search is the frozen model's: masks follow the sentence, not the beam
  row, however beams are reordered."""
  model, params, batch = tiny_model(estimators=Estimators.deterministic(), dropout_rate=0.3,
                                    attention_dropout_rate=0.0)
  mc, rng = layers.MCDropout(params), jax.random.key(5)
  inputs = batch["encoder_input_tokens"]
  _, aux = jitted(model.predict_batch_with_aux, method="beam", beam_size=6, alpha=0.6,
                  num_samples=num_samples, max_length=2)(mc, {"encoder_input_tokens": inputs},
                                                         rng)
  frozen = brute_force_scores(model, mc, inputs, rng, num_samples)
  plain = brute_force_scores(model, params, inputs, rng, 0)
  assert np.abs(frozen - plain).max() > 1e-2  # the masks change the scores
  for row in range(2):
    order = np.argsort(-frozen[row])
    found = [tuple(int(t) for t in seq) for seq in np.asarray(aux["all_sequences"][row])[:5]]
    assert found == [CANDIDATES[k] for k in order]
    np.testing.assert_allclose(aux["all_scores"][row, :5], frozen[row, order], rtol=1e-5)


def test_predict_methods_and_errors():
  model, params, batch = tiny_model()
  for method, num_samples in (("greedy", 0), ("sample", 2)):  # beam: tested above
    tokens, aux = jitted(model.predict_batch_with_aux, method=method, num_samples=num_samples,
                         num_decodes=3)(params, batch, jax.random.key(0))
    assert tokens.shape == (2, 6) and aux["scores"].shape == (2,)
    assert aux["all_sequences"].shape == (2, 1 if method == "greedy" else 3, 6)
    assert ("token_mutual_information" in aux) == (num_samples > 0)
  with pytest.raises(ValueError, match="method='nucleus' must be beam, greedy or sample"):
    model.predict_batch_with_aux(params, batch, method="nucleus")
  with pytest.raises(ValueError, match="num_samples=2 posterior samples need an rng"):
    model.score_batch(params, batch, None, num_samples=2)


@pytest.mark.slow  # compiles two decoders to compare their memory
def test_regenerated_decode_weights_decode_the_same_samples_in_one_copy_of_memory():
  """``decode_weights='regenerated'`` decodes exactly what ``stored`` does (the same S
  samples), and its compiled memory does not grow by a copy of the weights per sample
  while ``stored``'s does (XLA's memory analysis; a model whose weights dominate)."""
  config = TINY.replace(vocab_size=512, emb_dim=64, mlp_dim=512, num_heads=4, head_dim=16)
  stored = EncoderDecoderModel(config, num_train_units=1000)
  regenerated = EncoderDecoderModel(config, num_train_units=1000, decode_weights="regenerated")
  batch = {"encoder_input_tokens": jnp.full((1, 4), 3, jnp.int32),
           "decoder_target_tokens": jnp.full((1, 4), 3, jnp.int32)}
  shapes = {k: (1, 4) for k in ("encoder_input_tokens", "decoder_input_tokens",
                                "decoder_target_tokens", "decoder_loss_weights")}
  params = jax.jit(lambda k: nn.unbox(stored.get_initial_variables(k, shapes)["params"]))(
      jax.random.key(0))
  weight_bytes = sum(x.nbytes for path, x in jax.tree_util.tree_leaves_with_path(params)
                     if not jax.tree_util.keystr(path).endswith("_scale']"))

  def compiled(model, num_samples):
    fn = jax.jit(functools.partial(model.predict_batch_with_aux, method="greedy",
                                   num_samples=num_samples))
    fn = fn.lower(params, batch, jax.random.key(1)).compile()
    return fn, fn.memory_analysis()

  temp = {}
  for name, model in (("stored", stored), ("regenerated", regenerated)):
    for num_samples in (1, 8):
      fn, memory = compiled(model, num_samples)
      temp[name, num_samples] = memory.temp_size_in_bytes
      if num_samples == 8:
        tokens, aux = fn(params, batch, jax.random.key(1))
        if name == "stored":
          expected = (tokens, aux["scores"])
        else:
          np.testing.assert_array_equal(tokens, expected[0])
          np.testing.assert_allclose(aux["scores"], expected[1], rtol=1e-5)
  growth = {name: temp[name, 8] - temp[name, 1] for name in ("stored", "regenerated")}
  print(f"weights {weight_bytes / 2**20:.2f} MiB; temp growth S=1 -> 8: "
        f"stored {growth['stored'] / 2**20:.2f} MiB, regenerated "
        f"{growth['regenerated'] / 2**20:.2f} MiB")
  assert growth["stored"] >= 6 * weight_bytes
  # Regenerated grows by the samples' own caches only: less than one copy of the weights.
  assert growth["regenerated"] < weight_bytes
  with pytest.raises(ValueError, match="decode_weights='x' must be one of"):
    EncoderDecoderModel(config, num_train_units=1000, decode_weights="x")


def test_decoding_with_one_of_the_samples_alone():
  """sample_index=s decodes with the s-th of the S weight samples the rng defines: the
  posterior-mean decode of those sampled weights."""
  model, params, batch = tiny_model()
  rng = jax.random.key(4)
  one_sample = jax.jit(lambda p, b, k, i: model.predict_batch_with_aux(
      p, b, k, method="greedy", num_samples=3, sample_index=i))
  posterior_mean = jitted(model.predict_batch_with_aux, method="greedy")
  for s in range(3):
    tokens, aux = one_sample(params, batch, rng, s)
    weights = layers.sample_weights(params, jax.random.split(rng, 3)[s])
    expected, expected_aux = posterior_mean(weights, batch, rng)
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_allclose(aux["scores"], expected_aux["scores"], rtol=1e-5)
