"""The estimators' activation-sized noise work in the compute dtype (``noise_dtype``).

With the same key the noise ``z`` (and Flipout's ``eps`` and signs) is the same draw, so
bfloat16 and float32 noise work differ by rounding alone. The tolerance: every output within
4 bfloat16 ulps (4 x 2**-8 relative) of the output's scale (its largest magnitude), and
gradients within 4% of each gradient's largest entry (the bound first written, 2%, was
exceeded by local reparameterization's ``kernel_scale`` gradient, 2.35%: the variance's
backward pass runs in bfloat16 too). Whether training may use it is decided on a
training run's validation NLL, not here. The default (None) is the float32 path, unchanged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import layers

ULPS = 4 * 2.0 ** -8
GRADIENT_RTOL = 0.04


def run(layer_cls, noise_dtype, **kwargs):
  layer = layer_cls(dtype=jnp.bfloat16, noise_dtype=noise_dtype, **kwargs)
  x = jax.random.normal(jax.random.key(0), (4, 6, 32))
  params = layer.init(jax.random.key(1), x)["params"]
  # Posterior stddevs comparable to the means: the noise is a large share of each output.
  params["kernel_scale"] = params["kernel_scale"] + 3.0

  def loss(params):
    y = layer.apply({"params": params}, x, rngs={"sample": jax.random.key(2)})
    return jnp.sum(jnp.sin(y.astype(jnp.float32))), y

  (_, y), grads = jax.value_and_grad(loss, has_aux=True)(params)
  return np.asarray(y, np.float32), grads


@pytest.mark.parametrize("layer_cls, kwargs", [
    (layers.DenseLocalReparameterization, dict(features=64, bayesian_bias=True)),
    (layers.DenseFlipout, dict(features=64)),
    (layers.DenseGeneralFlipout, dict(features=(4, 16), use_bias=False)),
])
def test_bfloat16_noise_work_is_float32_to_rounding(layer_cls, kwargs):
  y32, g32 = run(layer_cls, None, **kwargs)
  y16, g16 = run(layer_cls, "bfloat16", **kwargs)
  scale = np.abs(y32).max()
  assert np.abs(y16 - y32).max() <= ULPS * scale
  assert np.abs(y16 - y32).max() > 0  # the bfloat16 path ran
  for name in g32:
    a, b = np.asarray(g16[name]), np.asarray(g32[name])
    assert np.abs(a - b).max() <= GRADIENT_RTOL * np.abs(b).max(), name


def test_the_default_is_the_float32_path():
  y_none, g_none = run(layers.DenseLocalReparameterization, None, features=8)
  y32, g32 = run(layers.DenseLocalReparameterization, "float32", features=8)
  np.testing.assert_array_equal(y_none, y32)
  for name in g32:
    np.testing.assert_array_equal(g_none[name], g32[name])


def test_attention_passes_noise_dtype_to_its_projections():
  attention = layers.MultiHeadDotProductAttentionFlipout(num_heads=2, qkv_features=16,
                                                          dtype=jnp.bfloat16)
  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  params = attention.init(jax.random.key(1), x)["params"]
  outputs = {dtype: attention.clone(noise_dtype=dtype).apply(
      {"params": params}, x, rngs={"sample": jax.random.key(2)}).astype(jnp.float32)
             for dtype in (None, "bfloat16")}
  difference = np.abs(np.asarray(outputs["bfloat16"] - outputs[None])).max()
  assert 0 < difference <= ULPS * np.abs(np.asarray(outputs[None])).max()
