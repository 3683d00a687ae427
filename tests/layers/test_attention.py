"""Bayesian multi-head attention: the swap with flax's layer, moments, KL, gradients,
sharding and the decoding cache.

Moments as in ``test_estimator_moments`` (N = 40,000 draws, every mean within
Z = 4.5 standard errors, every variance within 3.2%). Two quantities are
analytic: the ``query`` projection's output (captured from inside the layer),
``x @ loc`` with variance ``(x * x) @ stddev^2``; and the whole layer's output
when ``query``, ``key`` and ``value`` have (numerically) zero posterior
stddev, so the attended values ``h`` are fixed and only ``out`` is random:
mean ``h @ loc + b``, variance ``(h * h) @ stddev^2``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshbayes import layers
from meshbayes.layers import attention
from meshbayes.partitioning import Partitioner
from tests.layers.fixtures import (
  assert_moments,
  bayesian_classes,
  expected_bayesian,
  f64,
  randomize_posterior,
  shapes_and_specs,
  stddev,
)

BAYESIAN = bayesian_classes(layers.attention_class)
PROJECTIONS = ("query", "key", "value", "out")
NUM_SAMPLES = 40_000


def inputs(batch=2, q_length=3, kv_length=4, features=6):
  q = jax.random.normal(jax.random.key(10), (batch, q_length, features))
  kv = jax.random.normal(jax.random.key(11), (batch, kv_length, features))
  valid = jnp.ones((batch, kv_length), bool).at[-1, -1].set(False)  # one padded key
  mask = nn.make_attention_mask(jnp.ones((batch, q_length), bool), valid)
  return q, kv, mask


def as_posterior(flax_params, key):
  """Bayesian parameters whose posterior mean is ``flax_params`` (random, large stddevs)."""
  flat = traverse_util.flatten_dict(flax_params)
  out = {}
  for i, (path, value) in enumerate(sorted(flat.items())):
    if path[-1] == "kernel":
      out[path[:-1] + ("kernel_loc",)] = value
      out[path[:-1] + ("kernel_scale",)] = layers.softplus_inverse(
          jax.random.uniform(jax.random.fold_in(key, i), value.shape, minval=0.2, maxval=1.0))
    else:
      out[path] = value
  return traverse_util.unflatten_dict(out)


@pytest.mark.parametrize("normalize_qk", [False, True])
@pytest.mark.parametrize("cls_name", ("MultiHeadDotProductAttention",) + BAYESIAN)
def test_swap_for_flax_attention_keeps_names_and_shapes(cls_name, normalize_qk):
  q, kv, _ = inputs()
  kwargs = dict(num_heads=2, qkv_features=8, out_features=5, normalize_qk=normalize_qk)
  theirs = shapes_and_specs(nn.MultiHeadDotProductAttention(**kwargs), q)
  ours = shapes_and_specs(getattr(attention, cls_name)(**kwargs), q)
  if cls_name != "MultiHeadDotProductAttention":
    theirs = expected_bayesian(theirs)
  assert {k: v[0] for k, v in ours.items()} == {k: v[0] for k, v in theirs.items()}
  # Every parameter is annotated, T5X style.
  kernel = "kernel" if cls_name == "MultiHeadDotProductAttention" else "kernel_scale"
  assert ours[("query", kernel)] == ((6, 2, 4), P("embed", "heads", "kv"))
  assert ours[("out", kernel)] == ((2, 4, 5), P("heads", "kv", "embed"))
  assert ours[("query", "bias")] == ((2, 4), P("heads", "kv"))
  assert ours[("out", "bias")] == ((5,), P("embed"))
  if normalize_qk:
    assert ours[("key_ln", "scale")] == ((4,), P("kv"))


@pytest.mark.parametrize("normalize_qk", [False, True])
def test_posterior_mean_equals_flax_attention_with_the_same_weights(normalize_qk):
  q, kv, mask = inputs()
  kwargs = dict(num_heads=2, qkv_features=8, normalize_qk=normalize_qk)
  flax_layer = nn.MultiHeadDotProductAttention(**kwargs)
  flax_params = flax_layer.init(jax.random.key(0), q, kv)["params"]
  # Non-zero biases, so a bias in the wrong place shows.
  flax_params = jax.tree.map(lambda p: p + 0.1 * jnp.arange(p.size).reshape(p.shape) / p.size,
                             flax_params)
  expected = flax_layer.apply({"params": flax_params}, q, kv, mask=mask)

  twin = attention.MultiHeadDotProductAttention(**kwargs)
  np.testing.assert_allclose(twin.apply({"params": flax_params}, q, kv, mask=mask), expected,
                             rtol=1e-5, atol=1e-6)
  params = as_posterior(flax_params, jax.random.key(1))
  for cls_name in BAYESIAN:
    layer = getattr(attention, cls_name)(**kwargs)
    mean = layer.apply({"params": params}, q, kv, mask=mask, deterministic=True)
    np.testing.assert_allclose(mean, expected, rtol=1e-5, atol=1e-6, err_msg=cls_name)
    sampled = layer.apply({"params": params}, q, kv, mask=mask, rngs={"sample": jax.random.key(2)})
    assert float(jnp.max(jnp.abs(sampled - expected))) > 0.1, f"{cls_name} did not sample"


def test_attention_dropout_equals_flax_with_the_same_rng():
  q, _, mask = inputs(kv_length=3)
  kwargs = dict(num_heads=2, qkv_features=8, dropout_rate=0.5)
  flax_layer = nn.MultiHeadDotProductAttention(**kwargs)
  params = flax_layer.init(jax.random.key(0), q, deterministic=True)["params"]
  key = jax.random.key(3)
  expected = flax_layer.apply({"params": params}, q, mask=mask, deterministic=False,
                              dropout_rng=key)
  ours = attention.MultiHeadDotProductAttention(**kwargs)
  np.testing.assert_allclose(ours.apply({"params": params}, q, mask=mask, dropout_rng=key),
                             expected, rtol=1e-5, atol=1e-6)
  assert not np.allclose(expected, flax_layer.apply({"params": params}, q, mask=mask,
                                                    deterministic=True))
  # deterministic=True also switches dropout off, as flax's does.
  np.testing.assert_allclose(
      ours.apply({"params": params}, q, mask=mask, deterministic=True),
      flax_layer.apply({"params": params}, q, mask=mask, deterministic=True), rtol=1e-5)


def draw(layer, params, *args, **kwargs):
  def apply(key):
    out, state = layer.apply({"params": params}, *args, rngs={"sample": key},
                             capture_intermediates=lambda m, _: m.name == "query", **kwargs)
    return out, state["intermediates"]["query"]["__call__"][0]

  keys = jax.random.split(jax.random.key(1), NUM_SAMPLES)
  return [f64(a) for a in jax.jit(jax.vmap(apply))(keys)]


def test_flipout_query_projection_moments():
  q, kv, mask = inputs()
  layer = attention.MultiHeadDotProductAttentionFlipout(num_heads=2, qkv_features=8,
                                                        bayesian_bias=True)
  params = randomize_posterior(layer.init(jax.random.key(0), q, kv)["params"],
                               jax.random.key(2))
  _, query = draw(layer, params, q, kv, mask=mask)
  p = params["query"]
  mean = np.einsum("bld,dhk->blhk", f64(q), f64(p["kernel_loc"])) + f64(p["bias_loc"])
  var = (np.einsum("bld,dhk->blhk", f64(q) ** 2, f64(stddev(p["kernel_scale"])) ** 2)
         + f64(stddev(p["bias_scale"])) ** 2)
  assert_moments(query, mean, var)


def test_flipout_output_moments_with_only_the_out_projection_random():
  q, kv, mask = inputs()
  layer = attention.MultiHeadDotProductAttentionFlipout(num_heads=2, qkv_features=8)
  params = randomize_posterior(layer.init(jax.random.key(0), q, kv)["params"],
                               jax.random.key(2))
  for name in ("query", "key", "value"):  # stddev softplus(-30) ~ 1e-13
    params[name]["kernel_scale"] = jnp.full_like(params[name]["kernel_scale"], -30.0)
  samples, _ = draw(layer, params, q, kv, mask=mask)

  attended = _attended_values(params, q, kv, mask)
  loc, sd = f64(params["out"]["kernel_loc"]), f64(stddev(params["out"]["kernel_scale"]))
  mean = np.einsum("blhk,hkd->bld", attended, loc) + f64(params["out"]["bias"])
  # The hand-computed h is the layer's: its posterior mean is h @ loc + b.
  np.testing.assert_allclose(layer.apply({"params": params}, q, kv, mask=mask, deterministic=True),
                             mean, rtol=1e-5, atol=1e-6)
  assert_moments(samples, mean, np.einsum("blhk,hkd->bld", attended ** 2, sd ** 2))


def _attended_values(params, q, kv, mask):
  """``softmax(q k^T / sqrt(d)) v`` of the posterior-mean projections, computed by hand."""
  dense = lambda name, x: (np.einsum("bld,dhk->blhk", f64(x), f64(params[name]["kernel_loc"]))
                           + f64(params[name]["bias"]))
  query, key, value = dense("query", q), dense("key", kv), dense("value", kv)
  logits = np.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
  logits = np.where(np.asarray(mask), logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", weights, value)


def test_records_the_closed_form_kl_of_the_four_projections():
  q, kv, mask = inputs()
  prior = layers.NormalPrior(loc=0.3, stddev=0.7)
  layer = attention.MultiHeadDotProductAttentionFlipout(num_heads=2, qkv_features=8,
                                                        bayesian_bias=True, prior=prior)
  params = randomize_posterior(layer.init(jax.random.key(0), q, kv)["params"],
                               jax.random.key(1))
  expected = 0.0
  for projection in PROJECTIONS:
    for weight in ("kernel", "bias"):
      q_loc = f64(params[projection][f"{weight}_loc"])
      q_sd = f64(stddev(params[projection][f"{weight}_scale"]))
      expected += np.sum(np.log(0.7 / q_sd) + (q_sd ** 2 + (q_loc - 0.3) ** 2) / (2 * 0.49) - 0.5)
  for kwargs in ({"rngs": {"sample": jax.random.key(2)}}, {"deterministic": True}):
    _, state = layer.apply({"params": params}, q, kv, mask=mask, mutable=[layers.KL_COLLECTION],
                           **kwargs)
    assert sorted(state[layers.KL_COLLECTION]) == sorted(PROJECTIONS)
    np.testing.assert_allclose(layers.total_kl(state), expected, rtol=1e-5)


@pytest.mark.parametrize("cls_name", BAYESIAN)
def test_gradients_of_the_output_reach_every_loc_and_scale(cls_name):
  q, kv, mask = inputs()
  layer = getattr(attention, cls_name)(num_heads=2, qkv_features=8, use_bias=False)
  params = randomize_posterior(layer.init(jax.random.key(0), q, kv)["params"],
                               jax.random.key(2))

  def loss(params):  # the output alone: the scales' gradients come through the sampling
    y = layer.apply({"params": params}, q, kv, mask=mask, rngs={"sample": jax.random.key(1)})
    return jnp.mean(jnp.square(y - 1.0))

  grads = traverse_util.flatten_dict(jax.jit(jax.grad(loss))(params))
  assert set(grads) == {(p, w) for p in PROJECTIONS for w in ("kernel_loc", "kernel_scale")}
  for path, g in grads.items():
    assert bool(jnp.all(jnp.isfinite(g))), path
    assert float(jnp.max(jnp.abs(g))) > 0, f"no gradient reaches {path}"


def test_sharded_forward_backward_equals_unsharded():
  """Flipout attention with a mask and a logits bias on a 2x4 (data, model) mesh, heads over
  ``model``: loss and gradients equal the single-device ones."""
  layer = attention.MultiHeadDotProductAttentionFlipout(
      num_heads=4, qkv_features=16, bayesian_bias=True,
      activation_axes=("batch", "length", "heads", "kv"))
  q, _, _ = inputs(batch=4, q_length=5, features=8)
  mask = nn.make_causal_mask(jnp.ones((4, 5)))
  bias = jax.random.normal(jax.random.key(4), (1, 4, 5, 5))

  def loss_fn(params, q, key):
    y, state = layer.apply({"params": params}, q, mask=mask, bias=bias, rngs={"sample": key},
                           mutable=[layers.KL_COLLECTION])
    return jnp.mean(jnp.square(y - 1.0)) + layers.kl_penalty(layers.total_kl(state), 1000)

  params = nn.unbox(layer.init(jax.random.key(2), q)["params"])
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss_fn))(params, q, jax.random.key(3))
  partitioner = Partitioner(data=2, model=4, rules="megatron")
  sharded, shardings = partitioner.init(lambda k: layer.init(k, q)["params"], jax.random.key(2))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  with partitioner.activation_rules():
    step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, batch, None),
                   out_shardings=(None, shardings))
    loss, grads = step(sharded, q, jax.random.key(3))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for (path, grad), ref in zip(jax.tree_util.tree_flatten_with_path(grads)[0],
                               jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6, err_msg=str(path))
  assert grads["query"]["kernel_scale"].sharding.spec == P(None, "model", None)
  assert grads["out"]["kernel_loc"].sharding.spec == P("model", None, None)


@pytest.mark.parametrize("cls_name", ("MultiHeadDotProductAttention",) + BAYESIAN)
def test_decoding_with_the_cache_equals_the_causal_forward(cls_name):
  length = 5
  cls = getattr(attention, cls_name)
  x = jax.random.normal(jax.random.key(0), (2, length, 6))
  bias = jax.random.normal(jax.random.key(1), (1, 2, length, length))  # e.g. relative positions
  layer = cls(num_heads=2, qkv_features=8)
  params = layer.init(jax.random.key(2), x)["params"]
  # One weight sample, used at its "posterior mean" by every step, as model-averaged decoding does.
  params = layers.sample_weights(randomize_posterior(params, jax.random.key(3)), jax.random.key(4))
  full = layer.apply({"params": params}, x, mask=nn.make_causal_mask(jnp.ones((2, length))),
                     bias=bias, deterministic=True)

  decoder = cls(num_heads=2, qkv_features=8, decode=True, deterministic=True)
  cache = decoder.init(jax.random.key(2), x)["cache"]
  assert cache["cached_key"].shape == (2, length, 2, 4)
  step = jax.jit(lambda cache, x_t, bias_t: decoder.apply(
      {"params": params, "cache": cache}, x_t, bias=bias_t, mutable=["cache"]))
  outputs = []
  for t in range(length):
    y, state = step(cache, x[:, t:t + 1], bias[:, :, t:t + 1])
    cache = state["cache"]
    outputs.append(y)
  assert int(cache["cache_index"]) == length
  np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), full, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"one position at a time, queries of shape \(2, 1, 2, 4\)"):
    decoder.apply({"params": params, "cache": cache}, x[:, :2], mutable=["cache"])


def test_bias_needs_an_attention_fn_that_takes_it():
  q, _, _ = inputs()
  no_bias = lambda query, key, value, mask=None: nn.dot_product_attention(query, key, value,
                                                                          mask=mask)
  layer = attention.MultiHeadDotProductAttentionFlipout(num_heads=2, attention_fn=no_bias)
  variables = layer.init(jax.random.key(0), q)
  with pytest.raises(ValueError, match="a logits bias was given but attention_fn=<lambda> takes "
                                       "no `bias` argument"):
    layer.apply(variables, q, bias=jnp.zeros((1, 2, 3, 3)), deterministic=True)


def test_sampling_needs_the_sample_rng():
  q, _, _ = inputs()
  layer = attention.MultiHeadDotProductAttentionFlipout(num_heads=2)
  variables = layer.init(jax.random.key(0), q)
  with pytest.raises(ValueError, match="'query' samples its weights and needs a 'sample' rng"):
    layer.apply(variables, q)


def test_attention_class_by_estimator_name():
  assert [attention.attention_class(e).__name__ for e in layers.ESTIMATORS] == [
      "MultiHeadDotProductAttention", *BAYESIAN]
  with pytest.raises(ValueError, match="estimator='mc_dropout' is not one of deterministic"):
    attention.attention_class("mc_dropout")
