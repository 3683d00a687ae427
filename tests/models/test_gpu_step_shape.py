"""The step's shape for GPUs leaves the model's function as it was: unrolled layers compute
what scanned ones do, and cuDNN's fused attention is wired as XLA's attention (checked on
the CPU with JAX's XLA implementation standing in for cuDNN)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from meshbayes.models.transformer import Estimators, Transformer, TransformerConfig

TINY = TransformerConfig(vocab_size=32, emb_dim=32, num_heads=2, head_dim=16,
                         num_encoder_layers=2, num_decoder_layers=3, mlp_dim=64, dropout_rate=0.0)
# Padding in both sequences, so the masks matter.
INPUTS = jnp.array([[5, 6, 7, 8, 9, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 10]], jnp.int32)
TARGETS = jnp.array([[11, 12, 13, 0, 0, 0, 0, 0], [14, 15, 16, 17, 18, 19, 0, 0]], jnp.int32)
SHIFTED = jnp.pad(TARGETS[:, :-1], ((0, 0), (1, 0)))


def _params(config):
  model = Transformer(config)
  return nn.unbox(model.init(jax.random.key(0), INPUTS, SHIFTED, TARGETS)["params"])


def unrolled(scanned_params):
  """A scanned model's parameters as the unrolled model's: ``layers`` -> ``layers_i``."""
  flat = {}
  for path, value in traverse_util.flatten_dict(scanned_params).items():
    if "layers" not in path:
      flat[path] = value
      continue
    at = path.index("layers")
    for i in range(value.shape[0]):
      flat[path[:at] + (f"layers_{i}",) + path[at + 1:]] = value[i]
  return traverse_util.unflatten_dict(flat)


def _loss(config, deterministic):
  def loss(params):
    logits = Transformer(config).apply({"params": params}, INPUTS, SHIFTED, TARGETS,
                                       deterministic=deterministic)
    labels = jax.nn.one_hot(TARGETS, config.vocab_size)
    return -jnp.sum(jax.nn.log_softmax(logits.astype(jnp.float32)) * labels * (TARGETS > 0)[..., None])
  return jax.jit(jax.value_and_grad(loss))


@pytest.mark.parametrize("estimators", ["deterministic", "bayesian"])
def test_unrolled_layers_compute_what_scanned_layers_compute(estimators):
  config = TINY if estimators == "bayesian" else TINY.replace(
      estimators=Estimators.deterministic())
  scanned = _params(config)
  assert unrolled(scanned).keys() == _params(config.replace(scan_layers=False)).keys()
  # The Bayesian model at its posterior mean: its samples are drawn per layer either way, but
  # from keys split differently (equal in distribution, not draw for draw).
  value, grads = _loss(config, deterministic=True)(scanned)
  value_unrolled, grads_unrolled = _loss(config.replace(scan_layers=False), True)(
      unrolled(scanned))
  np.testing.assert_allclose(value_unrolled, value, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(grads_unrolled), jax.tree.leaves(unrolled(grads))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)  # float32 summation order


def test_the_cudnn_kernel_is_wired_as_xlas_attention(monkeypatch):
  asked = []

  def xla_in_place_of_cudnn(*args, implementation=None, **kwargs):
    asked.append(implementation)
    return dot_product_attention(*args, implementation="xla", **kwargs)

  dot_product_attention = jax.nn.dot_product_attention
  params = _params(TINY)
  expected = _loss(TINY, deterministic=True)(params)
  monkeypatch.setattr(jax.nn, "dot_product_attention", xla_in_place_of_cudnn)
  got = _loss(TINY.replace(attention_kernel="cudnn"), deterministic=True)(params)
  assert asked and set(asked) == {"cudnn"}
  np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(expected[1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_cudnn_kernel_refuses_attention_dropout_in_one_line():
  with pytest.raises(ValueError, match=r"attention_kernel='cudnn' takes no attention dropout "
                                       r"\(attention_dropout_rate=0.1\).*seed at compile time"):
    TransformerConfig(attention_kernel="cudnn")  # dropout_rate 0.1 reaches the weights
  assert TransformerConfig(attention_kernel="cudnn",
                           attention_dropout_rate=0.0).attention_weight_dropout == 0.0
  with pytest.raises(ValueError, match=r"attention_kernel='flash' must be one of \('xla', "
                                       r"'cudnn'\)"):
    TransformerConfig(attention_kernel="flash")


def test_the_gpu_gin_file_gives_the_chosen_shape():
  from meshbayes.models.configurables import preset_config
  config = preset_config("paper", bindings=["include 'hardware/gpu.gin'"])
  assert (config.scan_layers, config.remat_policy, config.dtype) == (False, "none", "bfloat16")
  assert (config.attention_kernel, config.attention_dropout_rate) == ("cudnn", 0.0)
  assert (config.emb_dim, config.dropout_rate) == (1024, 0.1)  # the preset's, untouched
