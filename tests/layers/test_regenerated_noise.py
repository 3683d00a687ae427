"""The layers' estimators draw their noise again in the backward pass instead of keeping it.

``estimators.regenerating`` wraps each estimator in a checkpoint that keeps
only its arguments: these tests check that the wrapped estimators keep no
noise, perturbation or variance for the backward pass, and that they give
the stored-noise estimators' outputs and gradients, for every estimator and
layer type, on one device and on a 2 x 4 mesh.
"""

import contextlib
import functools
import io

import flax.linen as nn
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import NamedSharding

from meshbayes import layers
from meshbayes.layers import attention, conv, embed, estimators
from meshbayes.layers.dense import dense_class, dense_general_class
from meshbayes.layers.variational import stddev_of_scale
from meshbayes.partitioning import Partitioner
from tests.layers.fixtures import BAYESIAN_ESTIMATORS, storing_noise

BAYESIAN = BAYESIAN_ESTIMATORS
def _matmul(x, kernel, preferred_element_type=None):
  return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                         preferred_element_type=preferred_element_type)


def _equations(jaxpr):
  """Every equation of ``jaxpr`` and of the jaxprs inside it."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _equations(sub)


def _kept(fn, *args):
  """``(shape, source)`` of what the backward pass of ``fn`` keeps, other than its arguments."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    print_saved_residuals(fn, *args)  # one "shape source" line per residual
  residuals = [line.split(" ", 1) for line in printed.getvalue().splitlines() if line.strip()]
  return [(shape, source) for shape, source in residuals
          if not source.startswith("from the argument") and not shape.startswith("key<")]


@pytest.mark.parametrize("name", BAYESIAN)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_backward_pass_keeps_the_arguments_and_the_key_alone(name, dtype):
  """Stored, the estimators keep noise (weight- or output-sized), signs, perturbations and the
  local reparameterization's float32 standard deviation; regenerated, nothing but the
  inputs, ``loc``, ``scale`` and the key (not even the stddev computed from ``scale``)."""
  x, ids = jnp.ones((64, 32), dtype), jnp.arange(64) % 32
  loc, scale = jnp.zeros((32, 48)), jnp.full((32, 48), -2.0)
  posterior = lambda loc, scale: estimators.Normal(loc, stddev_of_scale(scale), scale)
  losses = {
      "DENSE": (lambda f: lambda x, loc, scale: f(jax.random.key(0), _matmul, x, posterior(
          loc, scale)).astype(jnp.float32).sum(), (x, loc, scale)),
      "LOOKUP": (lambda f: lambda loc, scale: f(jax.random.key(0), ids, posterior(
          loc, scale)).sum(), (loc, scale)),
  }
  floating = lambda kept: [shape for shape, _ in kept if shape.startswith(("f32", "bf16"))]
  for table, (loss, args) in losses.items():
    stored = _kept(loss(estimators.STORED[table][name]), *args)
    regenerated = _kept(loss(getattr(estimators, table)[name]), *args)
    assert floating(regenerated) == [], (table, regenerated)
    assert floating(stored), (table, stored)


def test_a_policy_keeps_the_local_reparameterizations_variance_and_skips_its_matmul():
  """Saving ``VARIANCE_NAME`` keeps one float32 output-sized value, the variance, and the
  backward pass then multiplies 4 matrices, as stored (regenerated: 5, the variance again);
  outputs and gradients stay the stored ones."""
  keeping = estimators.regenerating(
      estimators.local_reparameterization,
      policy=jax.checkpoint_policies.save_only_these_names(estimators.VARIANCE_NAME))
  x, loc, scale = jnp.ones((64, 32)), jnp.full((32, 48), 0.1), jnp.full((32, 48), -2.0)

  def loss(f):
    return lambda x, loc, scale: f(jax.random.key(0), _matmul, x, estimators.Normal(
        loc, stddev_of_scale(scale), scale)).sum()

  assert [shape for shape, _ in _kept(loss(keeping), x, loc, scale)] == ["f32[64,48]"]
  grads = {f: jax.jit(jax.value_and_grad(loss(f), argnums=(0, 1, 2)))
           for f in (estimators.local_reparameterization, keeping,
                     estimators.DENSE["local_reparameterization"])}
  matmuls = {f: g.lower(x, loc, scale).as_text().count("stablehlo.dot_general")
             for f, g in grads.items()}
  assert list(matmuls.values()) == [6, 6, 7]  # 2 forward, 4 backward; +1 recomputed
  (ref, ref_grads), (new, new_grads) = (grads[f](x, loc, scale) for f in list(grads)[:2])
  np.testing.assert_allclose(new, ref, rtol=1e-6)
  for got, want in zip(new_grads, ref_grads):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["reparameterization", "flipout"])
def test_the_backward_pass_reuses_the_split_keys(name):
  """The keys split from the estimator's key are kept (``KEYS_NAME``): the gradient's program
  splits once, where without the policy the backward pass splits again."""
  x, loc, scale = jnp.ones((8, 32)), jnp.full((32, 48), 0.1), jnp.full((32, 48), -2.0)

  def splits(estimator):
    loss = lambda x, loc, scale: estimator(jax.random.key(0), _matmul, x, estimators.Normal(
        loc, stddev_of_scale(scale), scale)).sum()
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, loc, scale).jaxpr
    return sum(eqn.primitive.name == "random_split" for eqn in _equations(jaxpr))

  nothing_kept = estimators.regenerating(estimators.STORED["DENSE"][name],
                                         policy=jax.checkpoint_policies.nothing_saveable)
  assert (splits(estimators.DENSE[name]), splits(nothing_kept)) == (1, 2)


def test_swapped_tables_hold_within_the_block_only():
  before = {table: dict(getattr(estimators, table)) for table in estimators.STORED}
  with pytest.raises(RuntimeError, match="inside"):
    with storing_noise():
      for table, entries in estimators.STORED.items():
        assert getattr(estimators, table) == entries
      raise RuntimeError("inside")
  assert {table: getattr(estimators, table) for table in estimators.STORED} == before
  with pytest.raises(ValueError, match=r"tables \['DENS'\] are not among"):
    with estimators.swapped({"DENS": {}}):
      pass


@pytest.mark.parametrize("name", BAYESIAN)
def test_a_layer_keeps_no_weight_sized_value_for_its_kl_or_its_noise(name):
  """A Bayesian Dense layer's loss, outputs plus its KL: besides the parameters and the
  inputs, the backward pass keeps nothing floating, not even the stddev (weight-sized)
  that the KL's gradient needs, which is recomputed from ``scale``."""
  model = dense_class(name)(48, kernel_axes=("embed", "mlp"), bias_axes=("mlp",))
  x = jnp.ones((64, 32))
  params = nn.unbox(model.init(jax.random.key(0), x)["params"])

  def loss(params, x):
    y, state = model.apply({"params": params}, x, rngs={"sample": jax.random.key(1)},
                           mutable=[layers.KL_COLLECTION])
    return y.sum() + layers.total_kl(state)

  kept = [shape for shape, _ in _kept(loss, params, x) if shape.startswith(("f32", "bf16"))]
  assert all(shape in ("f32[]", "bf16[]") for shape in kept), kept


@pytest.mark.parametrize("name", BAYESIAN + ("conv_flipout",))
def test_outputs_and_gradients_equal_the_stored_ones_to_rounding(name):
  """Against the stored-noise estimator, with a Bayesian bias, in float32."""
  stored = getattr(estimators, name)
  regenerated = estimators.regenerating(stored)
  if name == "conv_flipout":
    contract = lambda x, k, preferred_element_type=None: lax.conv_general_dilated(
        x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        preferred_element_type=preferred_element_type)
    x = jax.random.normal(jax.random.key(1), (3, 5, 5, 4))
    shape = (3, 3, 4, 6)
  else:
    contract, x, shape = _matmul, jax.random.normal(jax.random.key(1), (3, 7, 16)), (16, 24)
  loc = jax.random.normal(jax.random.key(2), shape) * 0.3
  scale = jax.random.normal(jax.random.key(3), shape) - 1.0
  bias = (jnp.full(shape[-1:], 0.1), jnp.full(shape[-1:], -2.0))

  def loss(estimator, x, loc, scale, bias_loc, bias_scale):
    kernel = estimators.Normal(loc, stddev_of_scale(scale), scale)
    b = estimators.Normal(bias_loc, stddev_of_scale(bias_scale), bias_scale)
    y = estimator(jax.random.key(0), contract, x, kernel, b)
    return jnp.sum(jnp.sin(3.0 * y)), y

  grad = lambda f: jax.jit(jax.grad(lambda *a: loss(f, *a), argnums=range(5), has_aux=True))
  (ref, y_ref), (new, y_new) = [grad(f)(x, loc, scale, *bias) for f in (stored, regenerated)]
  np.testing.assert_allclose(y_new, y_ref, rtol=1e-6, atol=1e-7)
  for got, want in zip(new, ref):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


class DenseGeneralPair(nn.Module):
  """Into heads and back: ``DenseGeneral`` with output and input axis tuples."""

  estimator: str

  @nn.compact
  def __call__(self, x):
    cls = dense_general_class(self.estimator)
    h = cls(features=(4, 2), kernel_axes=("embed", "heads", "kv"), use_bias=False)(x)
    return cls(features=8, axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
               use_bias=False)(jnp.tanh(h))


class EmbedLookupAndAttend(nn.Module):
  """Lookup, then tied logits: the table's two estimators."""

  estimator: str

  @nn.compact
  def __call__(self, ids):
    table = embed.embed_class(self.estimator)(num_embeddings=16, features=8,
                                              embedding_axes=("vocab", "embed"))
    return table.attend(jnp.tanh(table(ids)))


class SelfAttention(nn.Module):
  estimator: str

  @nn.compact
  def __call__(self, x):
    layer = attention.attention_class(self.estimator)(
        num_heads=4, qkv_features=16, bayesian_bias=True,
        activation_axes=("batch", "length", "heads", "kv"))
    return layer(x, mask=nn.make_causal_mask(jnp.ones(x.shape[:2])))


def _conv(estimator):
  return conv.conv_class(estimator)(4, (3, 3), kernel_axes=(None, None, "embed", "mlp"),
                                    bias_axes=("mlp",))


class EveryLayer(nn.Module):
  """Every layer type side by side, each from its own inputs: the outputs' mean."""

  estimator: str

  @nn.compact
  def __call__(self, inputs):
    e = self.estimator
    dense = functools.partial(dense_class(e), 8, kernel_axes=("embed", "mlp"),
                              bias_axes=("mlp",))
    outputs = [dense(bayesian_bias=True)(inputs["x"]),
               dense(one_sample_per_example=e == "flipout")(inputs["x"]),
               DenseGeneralPair(e)(inputs["x"]), _conv(e)(inputs["image"]),
               EmbedLookupAndAttend(e)(inputs["ids"]), SelfAttention(e)(inputs["x"])]
    return sum(jnp.mean(jnp.sin(3.0 * y.astype(jnp.float32))) for y in outputs)


def _inputs():
  return {"x": jax.random.normal(jax.random.key(0), (8, 5, 8)),
          "image": jax.random.normal(jax.random.key(0), (8, 6, 6, 8)),
          "ids": jax.random.randint(jax.random.key(0), (8, 5), 0, 16)}


def _loss_and_grads(model, inputs, partitioner=None):
  def loss_fn(params, inputs, key):
    y, state = model.apply({"params": params}, inputs, rngs={"sample": key},
                           mutable=[layers.KL_COLLECTION])
    return y + layers.kl_penalty(layers.total_kl(state), 1000)

  init = lambda k: model.init(k, inputs)["params"]
  if partitioner is None:
    return jax.jit(jax.value_and_grad(loss_fn))(nn.unbox(init(jax.random.key(2))), inputs,
                                                jax.random.key(3))
  params, shardings = partitioner.init(init, jax.random.key(2))
  batch = jax.tree.map(lambda _: NamedSharding(partitioner.mesh, partitioner.batch_spec), inputs)
  with partitioner.activation_rules():
    step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, batch, None),
                   out_shardings=(None, shardings))
    return step(params, inputs, jax.random.key(3))


# On the mesh: make test-slow. make test runs the regenerating estimators (the layers'
# default) sharded against unsharded in every layer's and the sharded trainer's tests.
@pytest.mark.parametrize("sharded", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("estimator", BAYESIAN)
def test_layers_give_the_stored_noise_losses_and_gradients(estimator, sharded):
  """Each layer type (one model holding them all; a gradient's path names its layer) and
  estimator: regenerated, on one device or on a 2 x 4 mesh (``fsdp_tp``: weights split
  over both axes), equals stored on one device."""
  model, inputs = EveryLayer(estimator), _inputs()
  with storing_noise():
    ref_loss, ref_grads = _loss_and_grads(model, inputs)
  partitioner = Partitioner(data=2, model=4, rules="fsdp_tp") if sharded else None
  loss, grads = _loss_and_grads(model, inputs, partitioner)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for (path, grad), ref in zip(jax.tree_util.tree_flatten_with_path(grads)[0],
                               jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(grad, ref, rtol=2e-5, atol=1e-6, err_msg=str(path))
