"""Sums over a parameter tree in a kernel per group of layers: the same numbers as leaf by leaf.

The old path is optax's (``optax.tree.norm``, ``optax.clip_by_global_norm``) and a sum per
leaf; the new one stacks the same parameter of every layer (``multi_tensor``). A sum's order
of addition differs, so norms agree to float32 rounding (rtol 1e-6); where the norm does not
clip, the updates, and the losses (computed before the update), are bitwise equal.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from meshbayes.models import EncoderDecoderModel
from meshbayes.models.transformer import TransformerConfig
from meshbayes.training import multi_tensor
from meshbayes.training.optimizers import (LearningRate, Optimizer, decay_mask,
                                          posterior_scale_mask)
from meshbayes.training.train_step import StepFunctions, init_train_state, layer_stddevs

# Two unrolled layers per stack: the groups have two arrays each (small: each train step
# compiled here is an unrolled model).
CONFIG = TransformerConfig(vocab_size=32, emb_dim=16, num_heads=2, head_dim=8,
                           num_encoder_layers=2, num_decoder_layers=2, mlp_dim=32,
                           dropout_rate=0.0, scan_layers=False)


def batch():
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(2, CONFIG.vocab_size, (4, 8)), jnp.int32)
  return {"encoder_input_tokens": tokens, "decoder_input_tokens": tokens,
          "decoder_target_tokens": tokens, "decoder_loss_weights": jnp.ones((4, 8), jnp.float32)}


def state_and_steps(clip_gradient_norm):
  model = EncoderDecoderModel(CONFIG, num_train_units=1000)
  optimizer = Optimizer("adamw", LearningRate("constant", 1e-2, 0),
                        clip_gradient_norm=clip_gradient_norm)
  steps = StepFunctions.build(model, optimizer, lambda step: jnp.float32(1.0))
  shapes = {k: v.shape for k, v in batch().items()}
  state = nn.unbox(init_train_state(model, steps.optimizer, shapes, jax.random.key(0)))
  return state, steps


def old_step(steps, state, data, clip_gradient_norm):
  """The step as it was: optax's clipping and norm, each leaf's stddevs summed apart."""
  chain = optax.chain(optax.clip_by_global_norm(clip_gradient_norm),
                      optax.adamw(LearningRate("constant", 1e-2, 0), b1=0.9, b2=0.999,
                                  weight_decay=0.0, mask=decay_mask),
                      optax.masked(optax.scale(10.0), posterior_scale_mask))
  rng = jax.random.fold_in(jax.random.key(steps.seed), state.step)
  grads, metrics = jax.grad(steps.model.loss_fn, has_aux=True)(state.params, data, rng,
                                                               jnp.float32(1.0))
  updates, _ = chain.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  leaves = [v for k, v in layer_stddevs(params).items() if "mlp" in k]
  return params, dict(metrics, gradient_norm=optax.tree.norm(grads),
                      mlp=sum(jnp.sum(v) for v in leaves) / float(sum(v.size for v in leaves)))


def test_layer_groups_stack_one_parameter_of_every_layer():
  state, _ = state_and_steps(1.0)
  flat = traverse_util.flatten_dict(state.params, sep="/")
  groups = multi_tensor.layer_groups(flat)
  assert sum(len(g) for g in groups) == len(flat)
  assert sorted({len(g) for g in groups}) == [1, 2]  # per-layer parameters in twos
  assert multi_tensor.group_key("encoder/layers_12/attention/query/kernel_loc",
                                jnp.zeros((2, 3), jnp.bfloat16)) == (
      "encoder/layers/attention/query/kernel_loc", (2, 3), "bfloat16")
  norm_jaxpr = jax.make_jaxpr(multi_tensor.global_norm)(state.params)
  reductions = [e for e in norm_jaxpr.jaxpr.eqns if e.primitive.name == "reduce_sum"]
  assert len(reductions) == len(groups) < 0.6 * len(flat)


def test_global_norm_and_clipping_match_optax():
  state, _ = state_and_steps(1.0)
  grads = jax.tree.map(lambda p: jnp.cos(p * 3.0 + 1.0), state.params)
  norm = float(optax.tree.norm(grads))
  np.testing.assert_allclose(float(multi_tensor.global_norm(grads)), norm, rtol=1e-6)
  for max_norm in (norm / 3, norm * 2):  # clipped, then kept
    new, _ = multi_tensor.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    old, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(old)):
      if max_norm > norm:
        np.testing.assert_array_equal(a, b)
      else:
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-9)


def test_train_step_matches_the_leaf_by_leaf_step():
  data = batch()
  for clip in (1e-3, 1e6):  # the first clips the gradient, the second does not
    state, steps = state_and_steps(clip)
    new_state, metrics = jax.jit(steps.train_step)(state, data)
    params, old = jax.jit(lambda s, d: old_step(steps, s, d, clip))(state, data)
    assert float(metrics["loss"]) == float(old["loss"])
    np.testing.assert_allclose(metrics["gradient_norm"], old["gradient_norm"], rtol=1e-6)
    np.testing.assert_allclose(metrics["posterior_stddev/mlp"], old["mlp"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(params)):
      if clip > 1:
        np.testing.assert_array_equal(a, b)
      else:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_clip_by_global_norm_refuses_a_norm_that_is_not_positive():
  with pytest.raises(ValueError, match=r"max_norm=0 must be > 0"):
    multi_tensor.clip_by_global_norm(0)
