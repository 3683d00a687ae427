"""The model interface's numbers: the ELBO's terms, evaluation and Bayesian scoring."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import layers
from meshbayes.layers import KL_COLLECTION, total_kl
from meshbayes.models.encoder_decoder import EncoderDecoderModel, cross_entropy
from meshbayes.models.transformer import TransformerConfig
from meshbayes.models.transformer.config import Estimators
from tests.models.synthetic import make_batch

CONFIG = TransformerConfig(vocab_size=8, emb_dim=16, num_heads=2, head_dim=8,
                           num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                           dropout_rate=0.0)


def setup(**model_kwargs):
  model = EncoderDecoderModel(CONFIG, **({"num_train_units": 500.0} | model_kwargs))
  batch = {k: jnp.asarray(v) for k, v in make_batch(np.random.default_rng(0), 3, 6, 8).items()}
  shapes = {k: v.shape for k, v in batch.items()}
  params = jax.jit(lambda k: nn.unbox(model.get_initial_variables(k, shapes)["params"]))(
      jax.random.key(0))
  return model, params, batch


def test_cross_entropy_with_label_smoothing_against_its_definition():
  logits = jax.random.normal(jax.random.key(0), (4, 5))
  targets = jnp.array([0, 3, 4, 1])
  loss, nll, log_z = cross_entropy(logits, targets, label_smoothing=0.1)
  p = np.asarray(jax.nn.softmax(logits), np.float64)
  soft = np.full((4, 5), 0.1 / 4)
  soft[np.arange(4), np.asarray(targets)] = 0.9
  kl = np.sum(soft * (np.log(soft) - np.log(p)), axis=-1)  # smoothed loss = KL(soft || p)
  np.testing.assert_allclose(loss, kl, rtol=1e-5)
  np.testing.assert_allclose(nll, -np.log(p[np.arange(4), np.asarray(targets)]), rtol=1e-5)
  np.testing.assert_allclose(log_z, np.log(np.sum(np.exp(np.asarray(logits, np.float64)), -1)),
                             rtol=1e-5)
  plain, _, _ = cross_entropy(logits, targets)
  np.testing.assert_allclose(plain, nll)


@pytest.mark.parametrize("normalization",
                         ["tokens", pytest.param("examples", marks=pytest.mark.slow)])
def test_loss_is_nll_plus_z_loss_plus_scaled_kl(normalization):
  model, params, batch = setup(loss_normalization=normalization, z_loss=1e-3)
  rng = jax.random.key(5)
  loss, metrics = jax.jit(functools.partial(model.loss_fn, kl_weight=0.25))(params, batch, rng)
  # Recompute the same sample (same rng split) by hand.
  dropout_rng, sample_rng = jax.random.split(rng)
  logits, state = jax.jit(lambda p, b: model.module.apply(
      {"params": p}, b["encoder_input_tokens"], b["decoder_input_tokens"],
      b["decoder_target_tokens"], enable_dropout=True, mutable=[KL_COLLECTION],
      rngs={"dropout": dropout_rng, "sample": sample_rng}))(params, batch)
  log_p = np.asarray(jax.nn.log_softmax(logits), np.float64)
  targets, weights = np.asarray(batch["decoder_target_tokens"]), np.asarray(
      batch["decoder_loss_weights"])
  token_nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  log_z = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))
  denominator = weights.sum() if normalization == "tokens" else targets.shape[0]
  nll = (token_nll * weights).sum() / denominator
  z_loss = 1e-3 * (log_z ** 2 * weights).sum() / denominator
  kl = float(total_kl(state))
  np.testing.assert_allclose(metrics["nll"], nll, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl"], kl, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl_term"], 0.25 * kl / 500.0, rtol=1e-5)
  np.testing.assert_allclose(loss, nll + z_loss + 0.25 * kl / 500.0, rtol=1e-5)
  assert float(metrics["num_tokens"]) == weights.sum()


def test_without_weight_noise_the_loss_is_the_posterior_means_nll_plus_the_same_kl():
  """The MAP control (weight_noise=False): the training NLL is the posterior mean's, whatever
  the rng, and the KL penalty is the one the noisy model pays for the same parameters."""
  noisy, params, batch = setup()
  quiet = EncoderDecoderModel(CONFIG, num_train_units=500.0, weight_noise=False)
  loss = lambda model, seed: jax.jit(functools.partial(model.loss_fn, kl_weight=0.1))(
      params, batch, jax.random.key(seed))[1]
  first, second = loss(quiet, 1), loss(quiet, 2)
  np.testing.assert_array_equal(first["nll"], second["nll"])
  mean_nll = jax.jit(lambda p, b: quiet.eval_fn(p, b)[1]["nll"])(params, batch)
  np.testing.assert_allclose(first["nll"], mean_nll, rtol=1e-6)
  np.testing.assert_allclose(first["kl"], loss(noisy, 1)["kl"], rtol=1e-6)
  assert float(first["kl"]) > 0
  assert float(loss(noisy, 1)["nll"]) != float(loss(noisy, 2)["nll"])  # weight samples
  with pytest.raises(ValueError, match="weight_noise=0 must be True or False"):
    EncoderDecoderModel(CONFIG, num_train_units=500.0, weight_noise=0)


def test_eval_fn_uses_the_posterior_mean():
  model, params, batch = setup()
  first = jax.jit(model.eval_fn)(params, batch)
  second = jax.jit(model.eval_fn)(params, batch, jax.random.key(3))
  np.testing.assert_array_equal(first[0], second[0])
  assert float(first[1]["kl"]) > 0  # the ELBO's KL is reported at evaluation too


def test_eval_fn_monte_carlo_elbo_against_brute_force():
  """neg_elbo: the mean over S weight samples (one per call: one per sequence) of the
  NLL per token, plus KL / num_train_units; plugin_neg_elbo: the posterior mean's."""
  model, params, batch = setup()
  rng, num_samples = jax.random.key(4), 3
  _, metrics = jax.jit(functools.partial(model.eval_fn, num_samples=num_samples))(
      params, batch, rng)
  targets, weights = np.asarray(batch["decoder_target_tokens"]), np.asarray(
      batch["decoder_loss_weights"], np.float64)
  nll = jax.jit(lambda p: -jnp.take_along_axis(jax.nn.log_softmax(model.module.apply(
      {"params": p}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
      batch["decoder_target_tokens"], deterministic=True)), batch["decoder_target_tokens"][
          ..., None], -1)[..., 0])
  per_token = lambda p: float((np.asarray(nll(p), np.float64) * weights).sum() / weights.sum())
  sampled = np.mean([per_token(layers.sample_weights(params, key))
                     for key in jax.random.split(rng, num_samples)])
  kl = float(metrics["kl"])
  assert kl > 0 and targets.shape[0] == 3
  np.testing.assert_allclose(metrics["sampled_nll"], sampled, rtol=1e-5)
  np.testing.assert_allclose(metrics["neg_elbo"], sampled + kl / 500.0, rtol=1e-5)
  np.testing.assert_allclose(metrics["plugin_neg_elbo"], per_token(layers.posterior_mean(params))
                             + kl / 500.0, rtol=1e-5)
  assert float(metrics["sampled_nll"]) != float(metrics["nll"])
  # Without samples (the trainer's periodic evaluation), only the plug-in value.
  assert "neg_elbo" not in jax.jit(model.eval_fn)(params, batch)[1]


def test_bayesian_model_average_scores_against_brute_force():
  """score_batch with S samples: log of the mean of the S samples' token probabilities."""
  model, params, batch = setup()
  rng, num_samples = jax.random.key(9), 4
  sequence, aux = jax.jit(functools.partial(model.score_batch, num_samples=num_samples))(
      params, batch, rng)
  probs = jax.jit(lambda p, b, key: jax.nn.softmax(model.module.apply(
      {"params": layers.sample_weights(p, key)}, b["encoder_input_tokens"],
      b["decoder_input_tokens"], b["decoder_target_tokens"], deterministic=True)))
  per_sample = np.stack([np.asarray(probs(params, batch, key), np.float64)
                         for key in jax.random.split(rng, num_samples)])  # (S, batch, len, V)
  average = per_sample.mean(0)
  targets, weights = np.asarray(batch["decoder_target_tokens"]), np.asarray(
      batch["decoder_loss_weights"])
  token = np.log(np.take_along_axis(average, targets[..., None], -1)[..., 0]) * weights
  entropy = lambda p: -np.sum(p * np.log(p), -1)
  mutual_information = (entropy(average) - entropy(per_sample).mean(0)) * weights
  np.testing.assert_allclose(aux["token_log_probs"], token, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(sequence, token.sum(-1), rtol=1e-4)
  np.testing.assert_allclose(aux["token_mutual_information"], mutual_information, atol=1e-5)
  # Weight samples differ, so the samples disagree somewhere.
  assert float(np.max(aux["token_mutual_information"])) > 0
  # The posterior mean path reports no mutual information.
  assert "token_mutual_information" not in jax.jit(model.score_batch)(params, batch)[1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(loss_normalization="sum"), r"loss_normalization='sum' must be one of"),
    (dict(num_train_units=0), r"num_train_units=0 must be the \(positive\) number"),
    (dict(label_smoothing=1.0), r"label_smoothing=1.0 must be in \[0, 1\)"),
])
def test_model_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    EncoderDecoderModel(CONFIG, **({"num_train_units": 10} | kwargs))


def test_a_deep_ensemble_is_averaged_over_its_members_by_the_model_average_path():
  """Three deterministic members (three seeds): score_batch with an Ensemble is the log
  of the mean of the members' token probabilities, whatever num_samples > 0 asks, and
  greedy decoding's scores are those outputs' scores under the same mixture."""
  model = EncoderDecoderModel(CONFIG.replace(estimators=Estimators.deterministic()),
                              num_train_units=500.0)
  batch = {k: jnp.asarray(v) for k, v in make_batch(np.random.default_rng(0), 3, 6, 8).items()}
  shapes = {k: v.shape for k, v in batch.items()}
  init = jax.jit(lambda k: nn.unbox(model.get_initial_variables(k, shapes)["params"]))
  members = [init(jax.random.key(seed)) for seed in range(3)]
  ensemble = layers.Ensemble.stack(members)
  assert ensemble.size == 3
  probs = jax.jit(lambda p: jax.nn.softmax(model.module.apply(
      {"params": p}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
      batch["decoder_target_tokens"], deterministic=True)))
  average = np.mean([np.asarray(probs(p), np.float64) for p in members], 0)
  targets, weights = np.asarray(batch["decoder_target_tokens"]), np.asarray(
      batch["decoder_loss_weights"])
  expected = np.log(np.take_along_axis(average, targets[..., None], -1)[..., 0]) * weights
  for num_samples in (1, 5):
    _, aux = jax.jit(functools.partial(model.score_batch, num_samples=num_samples))(
        ensemble, batch, jax.random.key(0))
    np.testing.assert_allclose(aux["token_log_probs"], expected, rtol=1e-4, atol=1e-6)
    assert aux["sample_log_probs"].shape == (3, 3)
  assert_greedy_scores_are_the_rescored_outputs(model, ensemble, batch, jax.random.key(0))


def assert_greedy_scores_are_the_rescored_outputs(model, params, batch, rng, num_samples=3):
  """Greedy decoding's scores equal score_batch of its outputs, whole, with the same rng."""
  tokens, decoded = jax.jit(functools.partial(
      model.predict_batch_with_aux, method="greedy", num_samples=num_samples, max_length=6))(
          params, batch, rng)
  outputs = jnp.asarray(tokens)
  rescoring = {"encoder_input_tokens": batch["encoder_input_tokens"],
               "decoder_target_tokens": outputs,
               "decoder_input_tokens": jnp.pad(outputs[:, :-1], [(0, 0), (1, 0)]),
               "decoder_loss_weights": (outputs > 0).astype(jnp.float32)}
  log_probs, _ = jax.jit(functools.partial(model.score_batch, num_samples=num_samples))(
      params, rescoring, rng)
  np.testing.assert_allclose(decoded["scores"], log_probs, rtol=1e-4)


def test_mc_dropout_holds_each_mask_fixed_over_a_sequence_in_scoring_and_decoding():
  """MC dropout of a deterministic model (dropout 0.3, none on attention weights): scoring
  averages the S masks' probabilities (brute force: apply with each dropout key), and
  greedy decoding, one position at a time with the same S masks, scores its outputs
  exactly as re-scoring them whole does: each mask is shared by a sentence's positions."""
  config = CONFIG.replace(estimators=Estimators.deterministic(), dropout_rate=0.3,
                          attention_dropout_rate=0.0)
  model = EncoderDecoderModel(config, num_train_units=500.0)
  batch = {k: jnp.asarray(v) for k, v in make_batch(np.random.default_rng(0), 3, 6, 8).items()}
  shapes = {k: v.shape for k, v in batch.items()}
  params = jax.jit(lambda k: nn.unbox(model.get_initial_variables(k, shapes)["params"]))(
      jax.random.key(0))
  mc = layers.MCDropout(params)
  rng = jax.random.key(3)
  _, aux = jax.jit(functools.partial(model.score_batch, num_samples=3))(mc, batch, rng)
  probs = jax.jit(lambda key: jax.nn.softmax(model.module.apply(
      {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
      batch["decoder_target_tokens"], enable_dropout=True, rngs={"dropout": key})))
  per_mask = [np.asarray(probs(key), np.float64) for key in jax.random.split(rng, 3)]
  assert np.abs(per_mask[0] - per_mask[1]).max() > 1e-3  # the masks differ
  targets, weights = np.asarray(batch["decoder_target_tokens"]), np.asarray(
      batch["decoder_loss_weights"])
  expected = np.log(np.take_along_axis(np.mean(per_mask, 0), targets[..., None], -1)[..., 0])
  np.testing.assert_allclose(aux["token_log_probs"], expected * weights, rtol=1e-4, atol=1e-6)
  assert_greedy_scores_are_the_rescored_outputs(model, mc, batch, rng)
  # Without samples, MC dropout is the plain model.
  plain, _ = jax.jit(model.score_batch)(mc, batch)
  np.testing.assert_allclose(plain, jax.jit(model.score_batch)(params, batch)[0], rtol=1e-6)
