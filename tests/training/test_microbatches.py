"""Gradient accumulation: microbatches give the whole batch's gradient, update and metrics.

The batch's examples hold 1 to 7 target tokens, so its four microbatches hold
2, 4, 8 and 14: a mean of the microbatches' per-token means would weigh the
short examples' tokens 7 times as much as the long ones'. The model's
feed-forward layers are Bayesian with posterior stddevs of about 2e-13
against weights of 0.1 to 1: weight noise below float32 rounding, so every
microbatch's weight sample is, as the whole batch's, the posterior mean,
while the KL (about 29 nats per weight, a term of 0.44 in a loss of 5.2 per
token) must count once per step; the posterior scales' gradients are all KL.
With a large z-loss and label smoothing, every term of the loss is checked.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meshbayes.models import EncoderDecoderModel, Estimators
from meshbayes.models.transformer import TransformerConfig
from meshbayes.training.train_step import StepFunctions, gradients, init_train_state

CONFIG = TransformerConfig(
    vocab_size=32, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
    num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0, posterior_stddev_ratio=1e-12,
    estimators=Estimators(attention="deterministic", cross_attention="deterministic",
                          mlp="reparameterization"))
LENGTHS = (1, 1, 2, 2, 4, 4, 7, 7)  # target tokens of each example
NUM_MICROBATCHES = 4
LEARNING_RATE = 0.1
METRICS = ("loss", "nll", "z_loss", "accuracy", "num_tokens", "kl", "kl_term", "neg_elbo",
           "kl_weight", "gradient_norm")


def uneven_batch(length=8):
  rng = np.random.default_rng(0)
  mask = np.arange(length) < np.array(LENGTHS)[:, None]
  targets = np.where(mask, rng.integers(2, CONFIG.vocab_size, mask.shape), 0).astype(np.int32)
  return {"encoder_input_tokens": jnp.asarray(rng.integers(2, CONFIG.vocab_size, mask.shape,
                                                           np.int32)),
          "decoder_input_tokens": jnp.asarray(np.pad(targets[:, :-1], ((0, 0), (1, 0)))),
          "decoder_target_tokens": jnp.asarray(targets),
          "decoder_loss_weights": jnp.asarray(mask, jnp.float32)}


def recording_sgd(learning_rate):
  """SGD whose state is the gradient of the last step."""
  def update(grads, state, params=None):
    del state, params
    return jax.tree.map(lambda g: -learning_rate * g, grads), grads
  return optax.GradientTransformation(lambda params: jax.tree.map(jnp.zeros_like, params),
                                      update)


def step_functions(model, num_microbatches):
  return StepFunctions(model=model, optimizer=recording_sgd(LEARNING_RATE),
                       learning_rate=lambda s: LEARNING_RATE, kl_weight=lambda s: 0.5,
                       num_microbatches=num_microbatches)


@functools.cache
def initial_state():
  model = EncoderDecoderModel(CONFIG, num_train_units=1)  # any normalization: same parameters
  shapes = {k: v.shape for k, v in uneven_batch().items()}
  return jax.jit(lambda k: nn.unbox(init_train_state(model, recording_sgd(LEARNING_RATE),
                                                     shapes, k)))(jax.random.key(0))


def assert_trees_close(actual, desired, rtol):
  """Leaf by leaf, to ``rtol`` of the leaf's largest entry."""
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(actual)[0],
                          jax.tree.leaves(desired)):
    b = np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.max(np.abs(b)),
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("normalization",
                         ["tokens", pytest.param("examples", marks=pytest.mark.slow)])
def test_microbatches_give_the_whole_batch_gradient_step_and_metrics(normalization):
  model = EncoderDecoderModel(CONFIG, num_train_units=1e5, loss_normalization=normalization,
                              label_smoothing=0.1, z_loss=0.1)
  batch, state = uneven_batch(), initial_state()
  tokens = batch["decoder_loss_weights"].reshape(NUM_MICROBATCHES, -1).sum(1)
  assert tokens.tolist() == [2, 4, 8, 14]
  new_whole, metrics_whole = jax.jit(step_functions(model, 1).train_step)(state, batch)
  new_micro, metrics_micro = jax.jit(step_functions(model, NUM_MICROBATCHES).train_step)(
      state, batch)

  assert_trees_close(new_micro.opt_state, new_whole.opt_state, rtol=1e-5)  # the gradients
  assert_trees_close(new_micro.params, new_whole.params, rtol=1e-6)
  for name in METRICS:
    np.testing.assert_allclose(metrics_micro[name], metrics_whole[name], rtol=1e-5,
                               err_msg=name)
  assert float(metrics_whole["num_tokens"]) == sum(LENGTHS)
  print(f"{normalization}: KL term {float(metrics_whole['kl_term']):.3f} of loss "
        f"{float(metrics_whole['loss']):.3f}")


def test_a_batch_that_does_not_split_evenly_is_an_error():
  model = EncoderDecoderModel(CONFIG, num_train_units=1e5)
  with pytest.raises(ValueError, match="batch of 8 examples cannot be split into "
                                       "num_microbatches=3"):
    # The batch is checked before anything is computed, so no parameters are needed.
    gradients(model, None, uneven_batch(), jax.random.key(1), 0.5, num_microbatches=3)
