"""VectorQuantizer: nearest entries, straight-through gradients, losses, EMA, logical axes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshbayes.layers.kl import total_kl
from meshbayes.layers.vector_quantization import (
    VQ_LOSS_COLLECTION,
    VQ_STATS_COLLECTION,
    VectorQuantizer,
    code_usage,
    ema_update,
    quantize,
    total_vq_loss,
)
from meshbayes.partitioning import Partitioner

K, D = 16, 4
BETA = 0.3


def _data(seed=0, shape=(3, 5, 2, D)):
  return jax.random.normal(jax.random.key(seed), shape)


def _brute_force(x, codebook):
  """Squared distances of every vector to every entry, in float64, by differences."""
  flat = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  return ((flat[:, None, :] - np.asarray(codebook, np.float64)[None]) ** 2).sum(-1)


def _apply(vq, variables, x, mutable=(VQ_LOSS_COLLECTION, "intermediates"), **kw):
  y, state = vq.apply(variables, x, mutable=list(mutable), **kw)
  return y, state


def test_outputs_are_the_nearest_codebook_entries():
  vq = VectorQuantizer(K, commitment_cost=BETA)
  x = _data()
  variables = nn.unbox(vq.init(jax.random.key(1), x))
  codebook = variables["params"]["codebook"]
  assert codebook.shape == (K, D)
  y, state = _apply(vq, variables, x)
  codes = state["intermediates"]["codes"][0]
  assert codes.shape == x.shape[:-1] and codes.dtype == jnp.int32
  # Exactly the entries (bit for bit), and each the nearest one by brute force.
  np.testing.assert_array_equal(np.asarray(y), np.asarray(codebook)[np.asarray(codes)])
  distances = _brute_force(x, codebook)
  chosen = distances[np.arange(len(distances)), np.asarray(codes).ravel()]
  np.testing.assert_allclose(chosen, distances.min(axis=1), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(codes).ravel(), distances.argmin(axis=1))
  # The data are spread over the codebook, so a wrong argmin (e.g. argmax) would fail above.
  assert len(np.unique(np.asarray(codes))) > 4


def test_gradients_pass_straight_through_and_the_codebook_learns_from_its_loss_only():
  vq = VectorQuantizer(K, commitment_cost=BETA)
  x = _data(2)
  params = nn.unbox(vq.init(jax.random.key(1), x))["params"]
  weights = jax.random.normal(jax.random.key(3), x.shape)

  def parts(params, x):
    y, state = _apply(vq, {"params": params}, x)
    losses = state[VQ_LOSS_COLLECTION]
    return jnp.sum(weights * y), losses["vq_codebook"], losses["vq_commitment"]

  def grad_of(i):
    return jax.grad(lambda p, x: parts(p, x)[i], argnums=(0, 1))(params, x)

  (g_codebook_out, g_x_out) = grad_of(0)
  # Straight-through: d sum(w * y) / dx = w exactly; the output sends nothing to the codebook.
  np.testing.assert_array_equal(np.asarray(g_x_out), np.asarray(weights))
  np.testing.assert_array_equal(np.asarray(g_codebook_out["codebook"]), 0.0)

  codebook = np.asarray(params["codebook"], np.float64)
  codes = _brute_force(x, codebook).argmin(axis=1)
  flat = np.asarray(x, np.float64).reshape(-1, D)
  n = flat.size
  q = codebook[codes]
  # Codebook loss mean((sg(x) - e)^2): d/de_i = 2 / n * sum over its vectors of (e_i - x).
  (g_codebook_cb, g_x_cb) = grad_of(1)
  expected = np.zeros_like(codebook)
  np.add.at(expected, codes, 2.0 / n * (q - flat))
  np.testing.assert_allclose(g_codebook_cb["codebook"], expected, rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(g_x_cb), 0.0)
  # Commitment loss beta * mean((x - sg(e))^2): d/dx = 2 beta / n (x - e); nothing to the codebook.
  (g_codebook_cm, g_x_cm) = grad_of(2)
  np.testing.assert_allclose(np.asarray(g_x_cm).reshape(-1, D), 2 * BETA / n * (flat - q),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(g_codebook_cm["codebook"]), 0.0)


def test_losses_equal_their_definitions_and_sum_over_calls():
  vq = VectorQuantizer(K, commitment_cost=BETA)
  x = _data(4)
  variables = nn.unbox(vq.init(jax.random.key(1), x))
  _, state = _apply(vq, variables, x)
  codebook = np.asarray(variables["params"]["codebook"], np.float64)
  flat = np.asarray(x, np.float64).reshape(-1, D)
  q = codebook[_brute_force(x, codebook).argmin(axis=1)]
  mse = np.mean((flat - q) ** 2)
  losses = state[VQ_LOSS_COLLECTION]
  np.testing.assert_allclose(losses["vq_codebook"], mse, rtol=1e-5)
  np.testing.assert_allclose(losses["vq_commitment"], BETA * mse, rtol=1e-5)
  np.testing.assert_allclose(total_vq_loss(state), (1 + BETA) * mse, rtol=1e-5)
  assert float(total_kl(state)) == 0.0  # the KL helper does not count them

  class Twice(nn.Module):
    @nn.compact
    def __call__(self, a, b):
      vq = VectorQuantizer(K, commitment_cost=BETA)
      return vq(a), vq(b)

  twice = Twice()
  x2 = _data(5)
  v2 = nn.unbox(twice.init(jax.random.key(1), x, x2))
  _, s2 = twice.apply(v2, x, x2, mutable=[VQ_LOSS_COLLECTION])
  separate = [total_vq_loss(_apply(vq, {"params": v2["params"]["VectorQuantizer_0"]}, a)[1])
              for a in (x, x2)]
  np.testing.assert_allclose(total_vq_loss(s2), sum(separate), rtol=1e-6)
  # Nothing is recorded at init or when the collection is not mutable.
  assert VQ_LOSS_COLLECTION not in vq.init(jax.random.key(1), x)
  assert isinstance(vq.apply(variables, x), jax.Array)


def test_ema_update_equals_the_hand_computation_for_one_step():
  decay, eps = 0.9, 1e-3
  vq = VectorQuantizer(K, commitment_cost=BETA, ema=True, decay=decay, epsilon=eps)
  x = _data(6)
  variables = nn.unbox(vq.init(jax.random.key(1), x))
  assert "params" not in variables
  stats = variables[VQ_STATS_COLLECTION]
  codebook = np.asarray(stats["codebook"], np.float64)
  np.testing.assert_array_equal(stats["cluster_size"], np.ones(K))
  np.testing.assert_array_equal(stats["embed_sum"], stats["codebook"])

  y, state = vq.apply(variables, x, mutable=[VQ_STATS_COLLECTION, VQ_LOSS_COLLECTION])
  flat = np.asarray(x, np.float64).reshape(-1, D)
  codes = _brute_force(x, codebook).argmin(axis=1)
  # The output uses the codebook before the update.
  np.testing.assert_array_equal(np.asarray(y).reshape(-1, D),
                                np.asarray(stats["codebook"])[codes])
  counts = np.bincount(codes, minlength=K)
  sums = np.zeros((K, D))
  np.add.at(sums, codes, flat)
  n = decay * 1.0 + (1 - decay) * counts
  m = decay * codebook + (1 - decay) * sums
  smoothed = (n + eps) / (n.sum() + K * eps) * n.sum()
  new = state[VQ_STATS_COLLECTION]
  np.testing.assert_allclose(new["cluster_size"], n, rtol=1e-6)
  np.testing.assert_allclose(new["embed_sum"], m, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new["codebook"], m / smoothed[:, None], rtol=1e-5, atol=1e-6)
  assert np.abs(np.asarray(new["codebook"]) - codebook).max() > 1e-3  # it moved
  # With EMA only the commitment loss is recorded.
  losses = state[VQ_LOSS_COLLECTION]
  assert set(losses) == {"vq_commitment"}
  np.testing.assert_allclose(losses["vq_commitment"],
                             BETA * np.mean((flat - codebook[codes]) ** 2), rtol=1e-5)
  # No update when deterministic (the statistics come back unchanged).
  _, frozen = vq.apply(variables, x, deterministic=True, mutable=[VQ_STATS_COLLECTION])
  for name in ("codebook", "cluster_size", "embed_sum"):
    np.testing.assert_array_equal(frozen[VQ_STATS_COLLECTION][name], stats[name])
  # The pure function agrees with the layer.
  pure = ema_update(x, jnp.asarray(codes.reshape(x.shape[:-1])), stats["cluster_size"],
                    stats["embed_sum"], decay, eps)
  np.testing.assert_allclose(pure[2], new["codebook"], rtol=1e-6)


def test_codebook_and_statistics_carry_logical_axes():
  x = _data()
  boxes = VectorQuantizer(K).init(jax.random.key(0), x)["params"]
  assert boxes["codebook"].names == ("vocab", "embed")
  vq_boxes = VectorQuantizer(K, ema=True).init(jax.random.key(0), x)[VQ_STATS_COLLECTION]
  assert {k: v.names for k, v in vq_boxes.items()} == {
      "codebook": ("vocab", "embed"), "embed_sum": ("vocab", "embed"),
      "cluster_size": ("vocab",)}
  boxed_init = nn.with_logical_partitioning(nn.initializers.normal(), ("codes", "hidden"))
  flax_style = VectorQuantizer(K, codebook_init=boxed_init, codebook_axes=None)
  assert flax_style.init(jax.random.key(0), x)["params"]["codebook"].names == ("codes", "hidden")
  with pytest.raises(ValueError, match=r"codebook_axes=\('vocab', 'embed'\) disagrees"):
    VectorQuantizer(K, codebook_init=boxed_init).init(jax.random.key(0), x)


def test_code_usage_counts_and_perplexity():
  codes = jnp.array([[0, 3, 3], [5, 3, 0]])
  counts, perplexity = code_usage(codes, num_embeddings=8)
  np.testing.assert_array_equal(counts, [2, 0, 0, 3, 0, 1, 0, 0])
  p = np.array([2, 3, 1]) / 6
  np.testing.assert_allclose(perplexity, np.exp(-(p * np.log(p)).sum()), rtol=1e-6)
  _, uniform = code_usage(jnp.arange(8), 8)
  np.testing.assert_allclose(uniform, 8.0, rtol=1e-6)


def test_quantize_matches_brute_force_on_ties_and_bfloat16_input():
  codebook = jnp.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0]])
  q, i = quantize(jnp.zeros((1, 2)), codebook)  # equidistant from entries 0 and 1
  assert i.tolist() == [0] and q.tolist() == [[1.0, 0.0]]
  vq = VectorQuantizer(K)
  x = _data(7).astype(jnp.bfloat16)
  variables = nn.unbox(vq.init(jax.random.key(1), x))
  y, state = _apply(vq, variables, x)
  assert y.dtype == jnp.bfloat16 and variables["params"]["codebook"].dtype == jnp.float32
  codes = np.asarray(state["intermediates"]["codes"][0]).ravel()
  np.testing.assert_array_equal(codes, _brute_force(x, variables["params"]["codebook"])
                                .argmin(axis=1))


@pytest.mark.slow  # compiles for a 2x4 mesh
def test_sharded_forward_backward_equals_unsharded():
  def dense(features, axes):
    lecun = nn.initializers.lecun_normal()
    return nn.Dense(features, use_bias=False, kernel_init=nn.with_logical_partitioning(lecun, axes))

  class Bottleneck(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = VectorQuantizer(K)(dense(8, ("mlp", "embed"))(x))
      return dense(x.shape[-1], ("embed", "mlp"))(h)

  model = Bottleneck()
  x = _data(8, (8, 4, 8))

  def loss_fn(params, x):
    y, state = model.apply({"params": params}, x, mutable=[VQ_LOSS_COLLECTION])
    return jnp.mean((y - x) ** 2) + total_vq_loss(state)

  init = lambda k: model.init(k, x)["params"]
  params = nn.unbox(init(jax.random.key(2)))
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss_fn))(params, x)
  partitioner = Partitioner(data=2, model=4, rules="fsdp_tp")
  sharded, shardings = partitioner.init(init, jax.random.key(2))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  with partitioner.activation_rules():
    step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, batch),
                   out_shardings=(None, shardings))
    loss, grads = step(sharded, x)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for grad, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6)
  codebook = grads["VectorQuantizer_0"]["codebook"]
  assert codebook.sharding.spec == P("model", "data")
  assert float(jnp.abs(codebook).max()) > 0
