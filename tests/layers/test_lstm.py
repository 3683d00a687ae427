"""Bayesian LSTM cells: the flax twin, one weight sample per sequence, moments and KL."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from meshbayes import layers
from meshbayes.layers.lstm import LSTM_ESTIMATORS, RNN
from tests.layers.fixtures import (
  bayesian_classes,
  randomize_posterior,
  sharded_grads_equal_unsharded,
  stddev,
)

GATES = ("i", "f", "g", "o")
CELLS = bayesian_classes(layers.lstm_cell_class, LSTM_ESTIMATORS)
X = jax.random.normal(jax.random.key(0), (3, 5))
CARRY = (jax.random.normal(jax.random.key(1), (3, 4)), jax.random.normal(jax.random.key(2),
                                                                          (3, 4)))


def f64(x):
  return np.asarray(x, np.float64)


@pytest.mark.parametrize("cls_name", ("LSTMCell",) + CELLS)
def test_swap_with_flax_lstm_cell(cls_name):
  """Same parameter names and shapes as nn.LSTMCell (with _loc/_scale for Bayesian
  kernels), logical axes on each; with flax's weights as posterior means (moped_params),
  flax's outputs at the posterior mean."""
  flax_cell = nn.LSTMCell(features=4)
  flax_params = flax_cell.init(jax.random.key(3), CARRY, X)["params"]
  cell = getattr(layers, cls_name)(features=4)
  variables = cell.init(jax.random.key(4), CARRY, X)
  specs = nn.get_partition_spec(variables)["params"]
  params = nn.unbox(variables["params"])
  assert sorted(params) == sorted(flax_params)
  bayesian = cls_name != "LSTMCell"
  for name, sub in flax_params.items():
    assert sorted(params[name]) == sorted(
        leaf for leaf in sub for leaf in (
            [f"{leaf}_loc", f"{leaf}_scale"] if bayesian and leaf == "kernel" else [leaf]))
    for leaf, value in sub.items():
      for mine in [k for k in params[name] if k.startswith(leaf)]:
        assert params[name][mine].shape == value.shape
        assert tuple(specs[name][mine]) == (("embed", "mlp") if name[0] == "i" else (
            (None, "mlp") if leaf == "kernel" else ("mlp",)))
  mine = layers.moped_params(params, flax_params) if bayesian else flax_params
  expected = flax_cell.apply({"params": flax_params}, CARRY, X)
  got = cell.apply({"params": mine}, CARRY, X, deterministic=True)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got,
               expected)
  if bayesian:  # and the draws spread around it
    drawn = cell.apply({"params": mine}, CARRY, X, rngs={"sample": jax.random.key(5)})
    assert float(jnp.abs(drawn[1] - expected[1]).max()) > 1e-4


@pytest.mark.parametrize("cls_name", CELLS)
def test_scan_holds_one_weight_sample_over_time(cls_name):
  """With the forget gate shut (bias -1e4) and the hidden-state kernels at 0 (stddev 1e-9),
  a step's output depends on its input and the weights alone: fed the same input at
  every step, nn.RNN with the 'sample' rng not split over time gives the same output at
  every step (one weight sample per sequence), different examples different outputs
  (Flipout: a sample per example); with the rng split per step, the outputs change."""
  cell = getattr(layers, cls_name)(features=4)
  x = jnp.broadcast_to(jax.random.normal(jax.random.key(4), (3, 1, 5)), (3, 4, 5))
  x = x.at[1].set(x[0])  # examples 0 and 1 identical
  rnn = RNN(cell)
  params = randomize_posterior(rnn.init(jax.random.key(5), x)["params"], jax.random.key(6),
                               (0.2, 0.5))
  for gate in GATES:
    params["cell"][f"h{gate}"]["kernel_loc"] *= 0
    params["cell"][f"h{gate}"]["kernel_scale"] = jnp.full((4, 4), layers.softplus_inverse(1e-9))
  params["cell"]["hf"]["bias"] = jnp.full((4,), -1e4)
  rngs = {"sample": jax.random.key(7)}
  held = rnn.apply({"params": params}, x, rngs=rngs)
  np.testing.assert_allclose(held, jnp.broadcast_to(held[:, :1], held.shape), atol=1e-6)
  examples_differ = float(jnp.abs(held[0] - held[1]).max()) > 1e-3
  assert examples_differ == (cls_name == "LSTMCellFlipout")
  resampled = nn.RNN(cell, split_rngs={"params": False, "sample": True}).apply(
      {"params": params}, x, rngs=rngs)
  assert float(jnp.abs(resampled - resampled[:, :1]).max()) > 1e-3


@pytest.mark.parametrize("cls_name", CELLS)
def test_scan_equals_a_step_by_step_unroll_with_the_same_rngs(cls_name):
  """RNN over the whole sequence equals a Python loop that applies it one step at a time
  (carry in, carry out) with the same 'sample' key: the noise does not depend on the
  step. (A key per step, split_rngs={'sample': True}, fails this: step 0's key differs
  from the whole scan's step t key.)"""
  x = jax.random.normal(jax.random.key(4), (3, 4, 5))
  rnn = RNN(getattr(layers, cls_name)(features=4))
  params = randomize_posterior(rnn.init(jax.random.key(5), x)["params"], jax.random.key(6),
                               (0.2, 0.5))
  apply = jax.jit(lambda *a, **k: rnn.apply({"params": params}, *a,
                                           rngs={"sample": jax.random.key(7)}, **k),
                  static_argnames="return_carry")
  carry, outputs = rnn.cell.initialize_carry(jax.random.key(0), x[:, 0].shape), []
  for t in range(x.shape[1]):
    carry, y = apply(x[:, t:t + 1], initial_carry=carry, return_carry=True)
    outputs.append(y)
  np.testing.assert_allclose(apply(x), jnp.concatenate(outputs, 1), rtol=1e-5, atol=1e-6)


def test_a_sample_of_the_weights_scanned_equals_its_unroll():
  """One weight sample (sample_weights) at the posterior mean: nn.RNN's scan equals a
  Python loop of the cell over the time steps."""
  cell = layers.LSTMCellFlipout(features=4, deterministic=True)
  x = jax.random.normal(jax.random.key(4), (3, 6, 5))
  rnn = nn.RNN(cell)
  params = randomize_posterior(rnn.init(jax.random.key(5), x)["params"], jax.random.key(6),
                               (0.2, 0.5))
  weights = layers.sample_weights(params, jax.random.key(11))
  scanned = rnn.apply({"params": weights}, x)
  assert float(jnp.abs(scanned - rnn.apply({"params": params}, x)).max()) > 1e-3
  carry = cell.initialize_carry(jax.random.key(0), x[:, 0].shape)
  outputs = []
  for t in range(x.shape[1]):
    carry, y = cell.apply({"params": weights["cell"]}, carry, x[:, t])
    outputs.append(y)
  np.testing.assert_allclose(scanned, jnp.stack(outputs, 1), rtol=1e-5, atol=1e-6)


def test_nn_rnn_without_the_sample_rng_says_how_to_pass_it():
  rnn = nn.RNN(layers.LSTMCellReparameterization(features=4))  # split_rngs={'params': False}
  x = jnp.ones((2, 3, 5))
  variables = rnn.init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"needs a 'sample' rng.*inside nn.RNN or nn.scan also "
                                       r"pass split_rngs=\{'params': False, 'sample': False\}"):
    rnn.apply(variables, x, rngs={"sample": jax.random.key(1)})


@pytest.mark.parametrize("cls_name", CELLS)
def test_gate_pre_activation_moments(cls_name):
  """Each gate's pre-activation, the sum of its two dense maps (captured intermediates),
  has mean x W_loc + h U_loc + b and variance x^2 sigma_W^2 + h^2 sigma_U^2 (independent
  posteriors), over 40,000 draws of one step (4.5 standard errors; 3.2% on the variance)."""
  cell = getattr(layers, cls_name)(features=4)
  params = randomize_posterior(cell.init(jax.random.key(3), CARRY, X)["params"],
                               jax.random.key(8))

  def pre_activations(key):
    _, state = cell.apply({"params": params}, CARRY, X, rngs={"sample": key},
                          capture_intermediates=True)
    inter = state["intermediates"]
    return {g: inter[f"i{g}"]["__call__"][0] + inter[f"h{g}"]["__call__"][0] for g in GATES}

  n = 40_000
  samples = jax.jit(jax.vmap(pre_activations))(jax.random.split(jax.random.key(9), n))
  x, h = f64(X), f64(CARRY[1])
  for g in GATES:
    w, u = params[f"i{g}"], params[f"h{g}"]
    mean = x @ f64(w["kernel_loc"]) + h @ f64(u["kernel_loc"]) + f64(u["bias"])
    var = x ** 2 @ f64(stddev(w["kernel_scale"])) ** 2 + h ** 2 @ f64(
        stddev(u["kernel_scale"])) ** 2
    s = f64(samples[g])
    assert np.max(np.abs(s.mean(0) - mean) / np.sqrt(var / n)) < 4.5, g
    assert np.max(np.abs(s.var(0, ddof=1) / var - 1)) < 4.5 * math.sqrt(2 / (n - 1)), g


def test_kl_is_the_closed_form_sum_and_gradients_reach_loc_and_scale():
  cell = layers.LSTMCellFlipout(features=4, prior=layers.NormalPrior(stddev=0.5))
  params = randomize_posterior(cell.init(jax.random.key(3), CARRY, X)["params"],
                               jax.random.key(10))
  _, state = cell.apply({"params": params}, CARRY, X, rngs={"sample": jax.random.key(1)},
                        mutable=[layers.KL_COLLECTION])
  expected = 0.0
  for sub in params.values():
    mu, sd = f64(sub["kernel_loc"]), f64(stddev(sub["kernel_scale"]))
    expected += np.sum(np.log(0.5 / sd) + (sd ** 2 + mu ** 2) / (2 * 0.25) - 0.5)
  np.testing.assert_allclose(layers.total_kl(state), expected, rtol=1e-5)

  def loss(p):
    (c, h), _ = cell.apply({"params": p}, CARRY, X, rngs={"sample": jax.random.key(1)})
    return jnp.sum(h ** 2) + jnp.sum(c)
  grads = jax.grad(loss)(params)
  for name, sub in grads.items():
    assert float(jnp.abs(sub["kernel_loc"]).max()) > 0, name
    assert float(jnp.abs(sub["kernel_scale"]).max()) > 0, name


def test_rnn_records_the_cells_kl_once_per_sequence():
  """RNN records the cell's KL (the closed form, as one step of the cell records it, not
  once per step) and its gradient reaches the stddevs; plain nn.RNN's scan drops it."""
  x = jax.random.normal(jax.random.key(4), (3, 2, 5))
  rnn = RNN(layers.LSTMCellReparameterization(features=4, prior=layers.NormalPrior(stddev=0.5)),
            time_major=True)
  params = randomize_posterior(rnn.init(jax.random.key(5), x)["params"], jax.random.key(6))

  def kl(p, module=rnn):
    _, state = module.apply({"params": p}, x, rngs={"sample": jax.random.key(1)},
                            mutable=[layers.KL_COLLECTION])
    return layers.total_kl(state)
  expected = 0.0
  for sub in params["cell"].values():
    mu, sd = f64(sub["kernel_loc"]), f64(stddev(sub["kernel_scale"]))
    expected += np.sum(np.log(0.5 / sd) + (sd ** 2 + mu ** 2) / (2 * 0.25) - 0.5)
  np.testing.assert_allclose(kl(params), expected, rtol=1e-5)
  grads = jax.grad(kl)(params)["cell"]
  for name, sub in grads.items():
    assert float(jnp.abs(sub["kernel_scale"]).min()) > 0, name
  plain = nn.RNN(rnn.cell, split_rngs={"params": False, "sample": False}, time_major=True)
  assert float(kl(params, plain)) == 0.0


def test_lstm_cell_class_and_its_error():
  assert layers.lstm_cell_class("flipout") is layers.LSTMCellFlipout
  with pytest.raises(ValueError, match="estimator='local_reparameterization' is not one of "
                                       "deterministic, reparameterization, flipout"):
    layers.lstm_cell_class("local_reparameterization")


@pytest.mark.slow  # compiles two scans for 2x4 (15-20 s), as test_conv's sharded test
def test_sharded_forward_backward_equals_unsharded():
  """Two stacked nn.RNN layers (Flipout: activation-shaped signs; reparameterization:
  kernel-shaped noise, drawn shard by shard) on a 2x4 (data, model) mesh with fsdp_tp
  rules: loss and gradients equal the unsharded ones; kernels are sharded as their axes say."""

  class Stacked(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = RNN(layers.LSTMCellFlipout(8, bayesian_bias=True))(x)
      x = nn.with_logical_constraint(x, ("batch", None, "mlp"))
      x = RNN(layers.LSTMCellReparameterization(8, kernel_axes=("mlp", "embed"),
                                                recurrent_kernel_axes=(None, "embed"),
                                                bias_axes=("embed",)))(x)
      return x.mean(axis=1)

  model = Stacked()
  x = jax.random.normal(jax.random.key(0), (8, 5, 16))
  y = jax.random.randint(jax.random.key(1), (8,), 0, 8)

  grads, shardings = sharded_grads_equal_unsharded(model, x, y)
  flipout, reparameterization = grads["LSTMCellFlipout_0"], grads["LSTMCellReparameterization_0"]
  assert flipout["ii"]["kernel_scale"].sharding.spec == P("data", "model")
  assert flipout["hi"]["kernel_loc"].sharding.spec == P(None, "model")
  assert reparameterization["ii"]["kernel_loc"].sharding.spec == P("model", "data")
