"""The character LSTM example at toy size, on in-memory text (no data/ needed).

The full-size numbers (Tatoeba English, the command's defaults) are in the JSON
the command writes.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.examples import char_lstm
from meshbayes.layers import KL_COLLECTION, count_parameters, total_kl

WORDS = ["the cat sat on the mat.", "a dog ran to the park.", "the bird sang a song.",
         "we like to eat cake."]


def _text(count, seed):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, 2)) for _ in range(count)]


@pytest.mark.integration
def test_toy_run_beats_the_uniform_vocabulary(tmp_path):
  results = char_lstm.main(
      ["--output_dir", str(tmp_path), "--steps", "80", "--sentences", "200", "--val_sentences",
       "40", "--hidden", "32", "--embed_dim", "8", "--batch_size", "32", "--eval_every", "40",
       "--num_samples", "3", "--train_eval_samples", "3", "--learning_rate", "1e-2",
       "--max_length", "48"],
      train_text=_text(200, 0), val_text=_text(40, 1))
  assert (tmp_path / "char_lstm.png").stat().st_size > 10_000  # a drawn figure
  saved = json.loads((tmp_path / "char_lstm.json").read_text())
  vocab = char_lstm.CharVocabulary.build(_text(200, 0))
  assert saved["uniform_perplexity"] == vocab.size == 4 + len(set("".join(WORDS)))
  assert saved["val_unknown_characters"] == 0
  # Targets: every character plus the EOS of each of the 40 sentences.
  assert saved["val_characters"] == sum(len(s) + 1 for s in _text(40, 1))
  for name in ("bayesian", "deterministic"):
    metrics = saved[name]
    assert metrics["perplexity"] == pytest.approx(results[name]["perplexity"])
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["nll"]))
    assert metrics["tokens"] == saved["val_characters"]
    assert sum(metrics["reliability"]["bin_count"]) == pytest.approx(metrics["tokens"])
    assert all(math.isfinite(metrics[k]) for k in ("nll", "ece", "weighted_ece", "brier"))
    assert 0.0 <= metrics["ece"] < 1.0
    # Learned: far below the uniform distribution over the vocabulary (its perplexity).
    assert metrics["perplexity"] < saved["uniform_perplexity"] / 3
    curve = saved["curves"][name]
    assert [p["step"] for p in curve] == [0, 40, 80]
    assert curve[-1]["perplexity"] < curve[0]["perplexity"]
  bayesian = saved["bayesian"]
  assert bayesian["final_kl"] > 0 and math.isfinite(bayesian["final_kl"])
  assert bayesian["posterior_mean"]["perplexity"] < saved["uniform_perplexity"] / 3
  assert all(math.isfinite(p["perplexity_posterior_mean"]) for p in saved["curves"]["bayesian"])


def test_vocabulary_round_trip_and_targets():
  vocab = char_lstm.CharVocabulary.build(["héllo", "world"])
  ids = vocab.encode(["héllo", "hi"], max_length=6)
  assert ids.shape == (2, 8)
  assert vocab.decode(ids[0]) == "héllo"
  assert list(ids[1, :4]) == [char_lstm.BOS, ids[0, 1], char_lstm.UNK, char_lstm.EOS]
  assert np.sum(ids[:, 1:] != char_lstm.PAD) == (5 + 1) + (2 + 1)  # targets: chars + EOS
  with pytest.raises(ValueError, match="max_length"):
    vocab.encode(["too long"], max_length=3)


def test_bayesian_model_is_the_deterministic_twin_plus_a_posterior():
  ids = jnp.ones((2, 5), jnp.int32)
  init = lambda estimator: char_lstm.CharLSTM(vocab_size=11, embed_dim=4, hidden=8,
                                              estimator=estimator).init(jax.random.key(0), ids)
  deterministic = count_parameters(init("deterministic")["params"])
  bayesian = count_parameters(init("flipout")["params"])
  lstm_kernels = 4 * (4 * 8 + 8 * 8)  # input and hidden kernels of the four gates
  point = 11 * 4 + 4 * 8 + (8 * 11 + 11)  # embedding, LSTM biases, softmax layer
  assert deterministic.total == lstm_kernels + point
  assert bayesian.bayesian_weights == lstm_kernels and bayesian.total == 2 * lstm_kernels + point


def test_one_weight_sample_per_sequence_and_the_kl_recorded():
  model = char_lstm.CharLSTM(vocab_size=7, embed_dim=4, hidden=8, estimator="reparameterization")
  ids = jnp.array([[1, 4, 5, 6, 4, 5]] * 2, jnp.int32)
  variables = model.init(jax.random.key(0), ids)
  logits, state = model.apply(variables, ids, rngs={"sample": jax.random.key(1)},
                              mutable=[KL_COLLECTION])
  # Reparameterization: one weight sample per call, shared by the batch and every step.
  np.testing.assert_allclose(logits[0], logits[1], rtol=1e-6)
  other = model.apply(variables, ids, rngs={"sample": jax.random.key(2)})
  assert float(jnp.max(jnp.abs(other - logits))) > 1e-4
  mean = model.apply(variables, ids, deterministic=True)
  np.testing.assert_allclose(mean, model.apply(variables, ids, deterministic=True))
  assert float(total_kl(state)) > 0


def test_model_average_perplexity_is_exp_of_the_mean_nll():
  model = char_lstm.CharLSTM(vocab_size=7, embed_dim=4, hidden=8, estimator="flipout")
  ids = np.array([[1, 4, 5, 6, 2, 0], [1, 6, 5, 2, 0, 0]], np.int32)
  params = model.init(jax.random.key(0), ids[:, :-1])["params"]
  key = jax.random.key(3)
  metrics = char_lstm.evaluate(model, params, ids, key, num_samples=5, batch_size=1)
  # By hand: log mean_s p_s(target) of the 5 samples, over the 4 + 3 non-padding targets.
  sample = jax.jit(lambda inputs, k: jax.nn.log_softmax(
      model.apply({"params": params}, inputs, rngs={"sample": k})))
  total = 0.0
  for row in range(2):
    keys = jax.random.split(jax.random.fold_in(key, row), 5)
    log_probs = jnp.stack([sample(ids[row:row + 1, :-1], k) for k in keys])
    target = jnp.take_along_axis(log_probs, ids[row:row + 1, 1:][None, ..., None], -1)[..., 0]
    average = jax.scipy.special.logsumexp(target, axis=0) - jnp.log(5.0)
    total += float(jnp.sum(jnp.where(ids[row:row + 1, 1:] != 0, -average, 0.0)))
  assert metrics["tokens"] == 7
  assert metrics["nll"] == pytest.approx(total / 7, rel=1e-5)
  assert metrics["perplexity"] == pytest.approx(math.exp(total / 7), rel=1e-5)
