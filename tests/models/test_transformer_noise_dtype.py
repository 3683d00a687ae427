"""``TransformerConfig.noise_dtype``: the Bayesian attention and feed-forward layers' noise
work in another dtype (``meshbayes.layers``' ``noise_dtype``), wired through the model.

The tolerance, as in tests/layers/test_noise_dtype.py: with the same keys the noise is the
same draw, so bfloat16 noise work changes one train step's loss by rounding alone, within 4
bfloat16 ulps (4 x 2**-8 relative) of the float32 loss, and each parameter's gradient within
4% of its largest entry. None gives every layer its own default, the float32 path as it was.
"""

import flax.linen as nn
import jax
import numpy as np
import pytest

from meshbayes.layers.attention import _Attention
from meshbayes.layers.dense import _Linear
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import Estimators, TransformerConfig
from tests.models.synthetic import make_batch

ULPS = 4 * 2.0 ** -8
GRADIENT_RTOL = 0.04
TINY = TransformerConfig(vocab_size=32, emb_dim=32, num_heads=2, head_dim=16,
                         num_encoder_layers=1, num_decoder_layers=1, mlp_dim=64,
                         dropout_rate=0.0, dtype="bfloat16", scan_layers=False)
BATCH = make_batch(np.random.default_rng(0), 8, 10, 32)
SHAPES = {name: value.shape for name, value in BATCH.items()}


def train_step(noise_dtype, params):
  """Loss and gradients of one step of the tiny Bayesian Transformer (same keys each call)."""
  model = EncoderDecoderModel(TINY.replace(noise_dtype=noise_dtype), num_train_units=1e6)
  (loss, _), grads = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))(
      params, BATCH, jax.random.key(1))
  return float(loss), jax.tree.map(np.asarray, grads)


def test_bfloat16_noise_work_changes_a_train_step_by_rounding_only():
  model = EncoderDecoderModel(TINY, num_train_units=1e6)  # noise_dtype leaves params alone
  params = jax.jit(lambda key: nn.unbox(model.get_initial_variables(key, SHAPES)["params"]))(
      jax.random.key(0))
  loss32, grads32 = train_step(None, params)
  loss16, grads16 = train_step("bfloat16", params)
  assert 0 < abs(loss16 - loss32) <= ULPS * abs(loss32)  # the bfloat16 path ran
  flat16 = jax.tree_util.tree_leaves_with_path(grads16)
  for (path, g16), g32 in zip(flat16, jax.tree.leaves(grads32)):
    assert np.abs(g16 - g32).max() <= GRADIENT_RTOL * np.abs(g32).max(), \
        jax.tree_util.keystr(path)


def noise_dtypes(config):
  """Each attention and Dense layer the model builds: path -> (class name, noise_dtype)."""
  seen = {}

  def record(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, (_Linear, _Attention)):
      seen["/".join(module.path)] = (type(module).__name__, module.noise_dtype)
    return next_fun(*args, **kwargs)

  model = EncoderDecoderModel(config, num_train_units=1e6)
  with nn.intercept_methods(record):
    jax.eval_shape(lambda: model.get_initial_variables(jax.random.key(0), SHAPES))
  return seen


def test_every_bayesian_attention_and_feed_forward_layer_gets_the_noise_dtype():
  seen = noise_dtypes(TINY.replace(noise_dtype="bfloat16"))
  bayesian = {path: dtype for path, (name, dtype) in seen.items()
              if "Flipout" in name or "LocalReparameterization" in name}
  # Per side: self-attention (and the decoder's cross-attention) with its four
  # projections, and the gated feed-forward's three matrices.
  assert len(bayesian) == 2 * (1 + 4 + 3) + (1 + 4)
  assert set(bayesian.values()) == {"bfloat16"}
  assert any("mlp" in path and "wo" in path for path in bayesian)
  assert any("encoder_decoder_attention" in path and "query" in path for path in bayesian)
  # None (the default): every layer gets its own default, None, as before the field:
  # the program is the float32 path's, bitwise (tests/layers/test_noise_dtype.py).
  assert {dtype for _, dtype in noise_dtypes(TINY).values()} == {None}


def test_an_unknown_noise_dtype_is_one_line():
  with pytest.raises(ValueError, match=r"^TransformerConfig: noise_dtype='float16' must be "
                                       r"None \(float32\) or one of \('float32', 'bfloat16'\)$"):
    TransformerConfig(noise_dtype="float16")
  # Deterministic layers have no noise: the twin accepts the field and ignores it.
  assert TransformerConfig(noise_dtype="bfloat16", estimators=Estimators.deterministic())
