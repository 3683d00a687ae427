"""Bayesian LSTM cells: the flax twin, one weight sample per sequence, moments and KL."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import layers
from tests.layers.fixtures import randomize_posterior, stddev

GATES = ("i", "f", "g", "o")
X = jax.random.normal(jax.random.key(0), (3, 5))
CARRY = (jax.random.normal(jax.random.key(1), (3, 4)), jax.random.normal(jax.random.key(2),
                                                                          (3, 4)))


def f64(x):
  return np.asarray(x, np.float64)


@pytest.mark.parametrize("cls_name", ["LSTMCell", "LSTMCellReparameterization",
                                      "LSTMCellFlipout"])
def test_swap_with_flax_lstm_cell(cls_name):
  """Same parameter names and shapes as nn.LSTMCell (with _loc/_scale for Bayesian
  kernels), logical axes on each; at the posterior mean, flax's outputs exactly."""
  flax_cell = nn.LSTMCell(features=4)
  flax_params = flax_cell.init(jax.random.key(3), CARRY, X)["params"]
  cell = getattr(layers, cls_name)(features=4)
  variables = cell.init(jax.random.key(3), CARRY, X)
  specs = nn.get_partition_spec(variables)["params"]
  params = nn.unbox(variables["params"])
  assert sorted(params) == sorted(flax_params)
  bayesian = cls_name != "LSTMCell"
  for name, sub in flax_params.items():
    for leaf, value in sub.items():
      names = [f"{leaf}_loc", f"{leaf}_scale"] if bayesian and leaf == "kernel" else [leaf]
      for mine in names:
        assert params[name][mine].shape == value.shape
      assert tuple(specs[name][names[0]]) == (("embed", "mlp") if name[0] == "i" else (
          (None, "mlp") if leaf == "kernel" else ("mlp",)))
  mine = {name: {(f"{leaf}_loc" if bayesian and leaf == "kernel" else leaf): value
                 for leaf, value in sub.items()} for name, sub in flax_params.items()}
  if bayesian:
    for name in mine:
      mine[name]["kernel_scale"] = params[name]["kernel_scale"]
  expected = flax_cell.apply({"params": flax_params}, CARRY, X)
  got = cell.apply({"params": mine}, CARRY, X, deterministic=True)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got,
               expected)


@pytest.mark.parametrize("cls_name", ["LSTMCellReparameterization", "LSTMCellFlipout"])
def test_scan_holds_one_weight_sample_over_time(cls_name):
  """With the forget gate shut (bias -1e4) and the hidden-state kernels at 0 (stddev 1e-9),
  a step's output depends on its input and the weights alone: fed the same input at
  every step, nn.RNN with the 'sample' rng not split over time gives the same output at
  every step (one weight sample per sequence), different examples different outputs
  (Flipout: a sample per example); with the rng split per step, the outputs change."""
  cell = getattr(layers, cls_name)(features=4)
  x = jnp.broadcast_to(jax.random.normal(jax.random.key(4), (3, 1, 5)), (3, 6, 5))
  x = x.at[1].set(x[0])  # examples 0 and 1 identical
  rnn = nn.RNN(cell, split_rngs={"params": False, "sample": False})
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


def test_a_sampled_cell_scanned_equals_its_step_by_step_unroll():
  """One weight sample (sample_weights) at the posterior mean: nn.RNN's scan equals a
  Python loop of the cell over the time steps."""
  cell = layers.LSTMCellFlipout(features=4, deterministic=True)
  x = jax.random.normal(jax.random.key(4), (3, 6, 5))
  rnn = nn.RNN(cell)
  params = randomize_posterior(rnn.init(jax.random.key(5), x)["params"], jax.random.key(6),
                               (0.2, 0.5))
  weights = layers.sample_weights(params, jax.random.key(11))
  scanned = rnn.apply({"params": weights}, x)
  carry = cell.initialize_carry(jax.random.key(0), x[:, 0].shape)
  outputs = []
  for t in range(x.shape[1]):
    carry, y = cell.apply({"params": weights["cell"]}, carry, x[:, t])
    outputs.append(y)
  np.testing.assert_allclose(scanned, jnp.stack(outputs, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls_name", ["LSTMCellReparameterization", "LSTMCellFlipout"])
def test_gate_pre_activation_moments(cls_name):
  """With identity gates and activation, capture each gate's two dense maps: their sum has
  mean x W_loc + h U_loc + b and variance x^2 sigma_W^2 + h^2 sigma_U^2 (independent
  posteriors), over 40,000 draws (4.5 standard errors; 3.2% on the variance)."""
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


def test_lstm_cell_class_and_its_error():
  assert layers.lstm_cell_class("flipout") is layers.LSTMCellFlipout
  with pytest.raises(ValueError, match="estimator='local_reparameterization' is not one of "
                                       "deterministic, reparameterization, flipout"):
    layers.lstm_cell_class("local_reparameterization")
