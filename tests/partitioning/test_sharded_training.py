"""A jitted sharded forward/backward equals the unsharded one, on every mesh shape."""

import contextlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding

from meshbayes.layers import KL_COLLECTION, kl_penalty, total_kl
from meshbayes.models import MLP
from meshbayes.partitioning import Partitioner

MODEL = MLP(hidden_dims=(64, 64), num_classes=32,
            estimators=("flipout", "local_reparameterization", "reparameterization"))
X = jax.random.normal(jax.random.key(0), (16, 32))
Y = jax.random.randint(jax.random.key(1), (16,), 0, 32)


def loss_fn(params, x, y, key):
  logits, state = MODEL.apply({"params": params}, x, rngs={"sample": key},
                              mutable=[KL_COLLECTION])
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return nll + kl_penalty(total_kl(state), num_train_units=1000)


@pytest.fixture(scope="module")
def unsharded():
  params = nn.unbox(MODEL.init(jax.random.key(2), X)["params"])
  return jax.jit(jax.value_and_grad(loss_fn))(params, X, Y, jax.random.key(3))


# make test: the meshes split over both axes; all data or all model parallel: slow.
@pytest.mark.parametrize("rules", ["megatron", "fsdp_tp"])
@pytest.mark.parametrize("data, model", [
    pytest.param(1, 8, marks=pytest.mark.slow), (2, 4), (4, 2),
    pytest.param(8, 1, marks=pytest.mark.slow)])
def test_sharded_loss_and_gradients_match_unsharded(unsharded, data, model, rules):
  partitioner = Partitioner(data=data, model=model, rules=rules)
  params, shardings = partitioner.init(lambda k: MODEL.init(k, X)["params"], jax.random.key(2))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  with partitioner.activation_rules():
    step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(shardings, batch, batch, None),
                   out_shardings=(None, shardings))
    loss, grads = step(params, X, Y, jax.random.key(3))
  ref_loss, ref_grads = unsharded
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for (path, grad), ref in zip(jax.tree_util.tree_flatten_with_path(grads)[0],
                               jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6, err_msg=str(path))
  assert grads["dense_0"]["kernel_loc"].sharding == shardings["dense_0"]["kernel_loc"]


def gathered_shapes(partitioner, with_rules):
  """Shapes of every all-gather in the compiled 2-D-sharded training step."""
  model = MLP(hidden_dims=(128, 128), num_classes=256)
  x, y = jnp.ones((80, 48)), jnp.zeros((80,), jnp.int32)  # 80: a size no weight has

  def loss(params, x, y, key):
    logits, state = model.apply({"params": params}, x, rngs={"sample": key},
                                mutable=[KL_COLLECTION])
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean() + total_kl(state)

  params, shardings = partitioner.init(lambda k: model.init(k, x)["params"], jax.random.key(0))
  batch = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  context = partitioner.activation_rules() if with_rules else contextlib.nullcontext()
  with context:
    hlo = jax.jit(jax.value_and_grad(loss), in_shardings=(shardings, batch, batch, None)).lower(
        params, x, y, jax.random.key(1)).compile().as_text()
  return [tuple(int(d) for d in dims.split(",") if d)
          for dims in re.findall(r"= f32\[([\d,]*)\]\S* all-gather", hlo)]


def test_activation_constraints_stop_the_compiler_gathering_the_batch():
  """With 2-D parameters (fsdp_tp) weights are gathered over `data` for compute;
  activations must stay split over the batch. Without the rules in scope XLA
  gathers whole-batch activations; with them it gathers weights only."""
  partitioner = Partitioner(data=2, model=4, rules="fsdp_tp")
  with_rules = gathered_shapes(partitioner, with_rules=True)
  without_rules = gathered_shapes(partitioner, with_rules=False)
  assert with_rules and not any(80 in shape for shape in with_rules), with_rules
  assert any(80 in shape for shape in without_rules), without_rules
