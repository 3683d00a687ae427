"""bayesianize: flax models written with flax's own layers, made Bayesian without editing them.

On an MLP (``nn.Dense``), attention projections (``nn.DenseGeneral``), a CNN
(``nn.Conv``) and a tied-embedding model (``nn.Embed``, lookup and ``attend``):
the Bayesian parameter tree is the model's with each weight ``w`` become
``w_loc`` and ``w_scale`` of ``w``'s shape and logical axes; after MOPED the
posterior mean computes the trained model bit for bit; sampling varies with
the key, records each layer's KL (checked against the closed form), and each
layer's outputs have the analytic mean and variance of its posterior
(``conv(x, loc) + b`` and ``conv(x * x, stddev^2)``, in general the flax
layer applied to the mean and to the variance parameters).
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from meshbayes import layers
from meshbayes.layers.bayesianize import bayesianize, moped_init
from tests.layers.fixtures import (
  MLP,
  Attention,
  assert_moments,
  boxed,
  f64,
  one_line_error,
  randomize_posterior,
  shapes_and_specs,
  sharded_grads_equal_unsharded,
  stddev,
)

NUM_SAMPLES = 20_000


class CNN(nn.Module):
  """Two convolutions (one strided) and a Dense head, of classes given as attributes."""

  conv: Any = nn.Conv
  dense: Any = nn.Dense

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.lecun_normal()
    x = nn.relu(self.conv(8, (3, 3), kernel_init=boxed(init, None, None, "embed", "mlp"),
                          name="conv1")(x))
    x = self.conv(4, (3, 3), strides=2, padding="VALID",
                  kernel_init=boxed(init, None, None, "mlp", "embed"), name="conv2")(x)
    return self.dense(3, kernel_init=boxed(init, "embed", "vocab"), name="head")(x.mean((1, 2)))


class TiedLM(nn.Module):
  """Embeds ids and scores them against the same table (``attend``): one nn.Embed, two methods."""

  def setup(self):
    init = nn.initializers.normal(1.0)
    self.embed = nn.Embed(11, 6, embedding_init=boxed(init, "vocab", "embed"))
    self.proj = nn.Dense(6, kernel_init=boxed(nn.initializers.lecun_normal(), "embed", "mlp"))

  def __call__(self, ids):
    return self.embed.attend(nn.tanh(self.proj(self.embed(ids))))


MODELS = {  # model, example input; each model's tests also cover one estimator
    "mlp": (MLP(nn.Dense), jax.random.normal(jax.random.key(10), (4, 8))),
    "dense_general": (Attention(nn.DenseGeneral), jax.random.normal(jax.random.key(11), (2, 5, 8))),
    "cnn": (CNN(), jax.random.normal(jax.random.key(12), (2, 7, 7, 3))),
    "embed": (TiedLM(), jax.random.randint(jax.random.key(13), (2, 5), 0, 11)),
}
WEIGHTS = ("kernel", "embedding")


def expected_bayesian(deterministic):
  """The deterministic tree with each weight ``w`` replaced by ``w_loc`` and ``w_scale``."""
  out = {}
  for path, value in deterministic.items():
    if path[-1] in WEIGHTS:
      out[path[:-1] + (path[-1] + "_loc",)] = value
      out[path[:-1] + (path[-1] + "_scale",)] = value
    else:
      out[path] = value
  return out


def closed_form_kl(params):
  """Sum over layers of KL(N(loc, softplus(scale)^2) || N(0, 1)), per layer path."""
  flat = traverse_util.flatten_dict(nn.unbox(params))
  return {path[:-1]: float(layers.normal_kl(loc, stddev(flat[path[:-1] + (path[-1][:-3] + "scale",)]),
                                            0.0, 1.0).sum())
          for path, loc in flat.items() if path[-1].endswith("_loc")}


# Every estimator once per model; the moments test below crosses all of them with every layer.
MODEL_ESTIMATORS = [("mlp", "flipout"), ("dense_general", "reparameterization"),
                    ("cnn", "local_reparameterization"), ("embed", "flipout"),
                    ("embed", "reparameterization")]


@pytest.mark.parametrize("name, estimator", MODEL_ESTIMATORS)
def test_bayesian_structure_and_logical_axes(name, estimator):
  model, x = MODELS[name]
  deterministic = shapes_and_specs(model, x)
  bayesian = shapes_and_specs(bayesianize(model, estimator), x)
  assert bayesian == expected_bayesian(deterministic)
  assert sum(path[-1].endswith("_scale") for path in bayesian) >= 2


def test_logical_axes_of_each_kind_of_weight():
  specs = {name: shapes_and_specs(bayesianize(model), x) for name, (model, x) in MODELS.items()}
  assert specs["mlp"][("hidden", "kernel_scale")] == ((8, 16), P("embed", "mlp"))
  assert specs["mlp"][("hidden", "bias")] == ((16,), P("mlp"))
  assert specs["dense_general"][("out", "kernel_loc")] == ((2, 3, 8), P("heads", "kv", "embed"))
  assert specs["cnn"][("conv2", "kernel_scale")] == ((3, 3, 8, 4), P(None, None, "mlp", "embed"))
  assert specs["embed"][("embed", "embedding_scale")] == ((11, 6), P("vocab", "embed"))


@pytest.mark.parametrize("name", MODELS)
def test_moped_posterior_mean_is_the_trained_model_exactly(name):
  model, x = MODELS[name]
  trained = model.init(jax.random.key(1), x)
  bayesian = bayesianize(model, "flipout")
  variables = moped_init(bayesian, trained, x, delta=0.1)

  # Compiled, as models run: eagerly, flax's attend (a dot with the transposed table) and
  # meshbayes' (a dot_general contracting the table's features) differ in the last bit.
  posterior_mean = jax.jit(bayesian.clone(deterministic=True).apply)(variables, x)
  np.testing.assert_array_equal(posterior_mean, jax.jit(model.apply)(trained, x))
  flat, det = (traverse_util.flatten_dict(nn.unbox(v["params"])) for v in (variables, trained))
  for path, w in det.items():
    if path[-1] in WEIGHTS:
      np.testing.assert_array_equal(flat[path[:-1] + (path[-1] + "_loc",)], w)
      np.testing.assert_allclose(stddev(flat[path[:-1] + (path[-1] + "_scale",)]),
                                 np.maximum(0.1 * np.abs(w), 1e-6), rtol=1e-5, atol=1e-7)
    else:
      np.testing.assert_array_equal(flat[path], w)
  # The logical axes are the Bayesian model's own.
  assert (nn.get_partition_spec(variables["params"])
          == nn.get_partition_spec(bayesian.init(jax.random.key(0), x)["params"]))


@pytest.mark.parametrize("name, estimator", MODEL_ESTIMATORS)
def test_sampling_varies_with_the_key_and_records_each_layers_kl(name, estimator):
  model, x = MODELS[name]
  bayesian = bayesianize(model, estimator)
  variables = moped_init(bayesian, model.init(jax.random.key(1), x), x, delta=0.5)

  @jax.jit
  def sample_with_key(key):
    return bayesian.apply(variables, x, rngs={"sample": key}, mutable=[layers.KL_COLLECTION])

  sample = lambda seed: sample_with_key(jax.random.key(seed))

  (y1, state), (y2, _), (y1_again, _) = sample(1), sample(2), sample(1)
  mean = bayesian.clone(deterministic=True).apply(variables, x)
  np.testing.assert_array_equal(y1, y1_again)
  assert float(jnp.abs(y1 - y2).mean()) > 1e-3 * float(jnp.abs(mean).mean())
  assert float(jnp.abs(y1 - mean).mean()) > 1e-3 * float(jnp.abs(mean).mean())

  recorded = {path[:-1]: float(kl) for path, kl in
              traverse_util.flatten_dict(state[layers.KL_COLLECTION]).items()}
  expected = closed_form_kl(variables["params"])
  assert recorded.keys() == expected.keys()
  for path in expected:
    np.testing.assert_allclose(recorded[path], expected[path], rtol=1e-5, err_msg=str(path))


# One layer of each kind, bayesianized alone (its parameters at the top of the tree); its
# outputs must have the analytic moments. Inputs are small so 20,000 draws stay fast. Each
# estimator's moments on every layer are test_estimator_moments' and test_conv's; here each
# kind of layer and each estimator appear at least once.
LAYERS = {
    "dense": (nn.Dense(3), jax.random.normal(jax.random.key(0), (2, 4))),
    "dense_general": (nn.DenseGeneral((2, 2), axis=(-2, -1)),
                      jax.random.normal(jax.random.key(0), (2, 3, 2))),
    "conv": (nn.Conv(2, (2, 2)), jax.random.normal(jax.random.key(0), (2, 3, 3, 2))),
    "embed": (nn.Embed(5, 3), jnp.array([[0, 3, 3], [4, 1, 0]])),
}


def as_deterministic(params, role):
  """``w_loc`` (role 'loc') or ``softplus(w_scale)^2`` (role 'var') as the flax layer's ``w``;
  biases kept for the mean and zeroed for the variance."""
  out = {}
  for name, value in params.items():
    if name.endswith("_loc") and role == "loc":
      out[name[:-4]] = value
    elif name.endswith("_scale") and role == "var":
      out[name[:-6]] = stddev(value) ** 2
    elif not name.endswith(("_loc", "_scale")):
      out[name] = value if role == "loc" else jnp.zeros_like(value)
  return out


@pytest.mark.parametrize("name, estimator", [
    ("dense", "flipout"), ("dense_general", "local_reparameterization"),
    ("conv", "flipout"), ("conv", "reparameterization"),
    ("embed", "flipout"), ("embed", "local_reparameterization")])
def test_each_layer_kind_has_its_posteriors_moments(name, estimator):
  layer, x = LAYERS[name]
  bayesian = bayesianize(layer, estimator)
  params = jax.jit(randomize_posterior)(bayesian.init(jax.random.key(0), x)["params"],
                                        jax.random.key(2))
  apply = lambda key: bayesian.apply({"params": params}, x, rngs={"sample": key})
  samples = f64(jax.jit(jax.vmap(apply))(jax.random.split(jax.random.key(1), NUM_SAMPLES)))

  mean = layer.apply({"params": as_deterministic(params, "loc")}, x)
  # A lookup's variance is the looked-up stddev^2; a linear map's is the map of x * x.
  x2 = x if name == "embed" else jnp.square(x)
  var = layer.apply({"params": as_deterministic(params, "var")}, x2)
  assert_moments(samples, f64(mean), f64(var))


def test_estimator_per_layer_type_equals_the_hand_swapped_model():
  """Each flax layer type gets its own estimator, and the result is bit for bit the model
  with its layers swapped by hand (the same parameters under the same paths, the same keys)."""
  model, x = MODELS["cnn"]
  bayesian = bayesianize(model, {nn.Conv: "local_reparameterization", "Dense": "deterministic"})
  variables = bayesian.init(jax.random.key(0), x)
  assert set(variables["params"]["head"]) == {"kernel", "bias"}  # nn.Dense left as written
  assert set(variables["params"]["conv1"]) == {"kernel_loc", "kernel_scale", "bias"}
  y, state = bayesian.apply(variables, x, rngs={"sample": jax.random.key(2)},
                            mutable=[layers.KL_COLLECTION])
  assert set(state[layers.KL_COLLECTION]) == {"conv1", "conv2"}

  by_hand = CNN(conv=layers.ConvLocalReparameterization)
  y_by_hand, state_by_hand = by_hand.apply(variables, x, rngs={"sample": jax.random.key(2)},
                                           mutable=[layers.KL_COLLECTION])
  np.testing.assert_array_equal(y, y_by_hand)
  assert float(layers.total_kl(state)) == float(layers.total_kl(state_by_hand))


class Shared(nn.Module):
  """One nn.Dense, defined in setup, called twice."""

  def setup(self):
    self.dense = nn.Dense(4)

  def __call__(self, x):
    return self.dense(x), self.dense(x)


def test_a_layer_called_twice_samples_twice_and_records_its_kl_once():
  x = jnp.ones((2, 3))
  bayesian = bayesianize(Shared(), "reparameterization")
  variables = bayesian.init(jax.random.key(0), x)
  assert set(variables["params"]) == {"dense"}
  (a, b), state = bayesian.apply(variables, x, rngs={"sample": jax.random.key(1)},
                                 mutable=[layers.KL_COLLECTION])
  assert not np.allclose(a, b)  # a fresh weight sample per call
  np.testing.assert_allclose(float(layers.total_kl(state)),
                             sum(closed_form_kl(variables["params"]).values()), rtol=1e-5)


def test_prior_and_bayesian_bias_reach_every_layer():
  model, x = MODELS["mlp"]
  prior = layers.NormalPrior(stddev=0.5)
  bayesian = bayesianize(model, "flipout", prior=prior, bayesian_bias=True)
  variables = bayesian.init(jax.random.key(0), x)
  assert set(variables["params"]["out"]) == {"kernel_loc", "kernel_scale", "bias_loc",
                                             "bias_scale"}
  _, state = jax.jit(lambda v: bayesian.apply(v, x, rngs={"sample": jax.random.key(1)},
                                              mutable=[layers.KL_COLLECTION]))(variables)
  flat = traverse_util.flatten_dict(nn.unbox(variables["params"]))
  expected = sum(float(layers.normal_kl(loc, stddev(flat[p[:-1] + (p[-1][:-3] + "scale",)]),
                                        0.0, 0.5).sum())
                 for p, loc in flat.items() if p[-1].endswith("_loc"))
  np.testing.assert_allclose(float(layers.total_kl(state)), expected, rtol=1e-5)


def test_other_methods_of_the_model_run_bayesian_through_call_method():
  embed, ids = LAYERS["embed"]
  query = jax.random.normal(jax.random.key(0), (2, 3))
  bayesian = bayesianize(embed, "flipout")
  trained = embed.init(jax.random.key(1), ids)
  variables = moped_init(bayesian, trained, ids, delta=0.5)
  attend = lambda module, q: module.call_method("attend", q)
  mean = jax.jit(lambda v: bayesian.clone(deterministic=True).apply(v, query, method=attend))
  np.testing.assert_array_equal(mean(variables),
                                jax.jit(lambda v: embed.apply(v, query, method="attend"))(trained))
  sampled, state = bayesian.apply(variables, query, method=attend,
                                  rngs={"sample": jax.random.key(2)},
                                  mutable=[layers.KL_COLLECTION])
  assert not np.allclose(sampled, mean(variables))
  np.testing.assert_allclose(float(layers.total_kl(state)),
                             sum(closed_form_kl(variables["params"]).values()), rtol=1e-5)


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return nn.tanh(nn.Dense(4, name="dense")(x)), None


class Stack(nn.Module):
  """Three blocks under nn.scan: the layer posteriors and KLs are stacked along the scan."""

  @nn.compact
  def __call__(self, x):
    blocks = nn.scan(Block, variable_axes={"params": 0, layers.KL_COLLECTION: 0},
                     split_rngs={"params": True, "sample": True}, length=3)
    return blocks(name="blocks")(x, None)[0]


def test_layers_inside_nn_scan_are_replaced_per_step():
  x = jax.random.normal(jax.random.key(0), (2, 4))
  bayesian = bayesianize(Stack(), "flipout")
  variables = bayesian.init(jax.random.key(1), x)
  assert jax.tree.map(jnp.shape, variables["params"]["blocks"]["dense"]) == {
      "bias": (3, 4), "kernel_loc": (3, 4, 4), "kernel_scale": (3, 4, 4)}
  y, state = bayesian.apply(variables, x, rngs={"sample": jax.random.key(2)},
                            mutable=[layers.KL_COLLECTION])
  assert state[layers.KL_COLLECTION]["blocks"]["dense"]["kl"].shape == (3,)
  np.testing.assert_allclose(float(layers.total_kl(state)),
                             sum(closed_form_kl(variables["params"]).values()), rtol=1e-5)
  assert not np.allclose(y, bayesian.clone(deterministic=True).apply(variables, x))


def test_errors_are_one_clear_line():
  model, x = MODELS["mlp"]
  one_line_error(r"bayesianize: estimator='mc_dropout' is not one of deterministic, "
                 r"reparameterization, flipout, local_reparameterization",
                 bayesianize, model, "mc_dropout")
  one_line_error(r"estimator='flipot' for Dense is not one of",
                 bayesianize, model, {"Dense": "flipot"})
  one_line_error(r"layer type 'BatchNorm' is not one of Dense, DenseGeneral, Conv, Embed",
                 bayesianize, model, {nn.BatchNorm: "flipout"})
  masked = bayesianize(CNN(conv=functools.partial(nn.Conv, mask=jnp.ones((3, 3, 3, 8)))))
  one_line_error(r"bayesianize: Conv 'conv1' sets mask, which ConvFlipout does not support "
                 r"\(only its default None\); leave it unset or exclude the layer type",
                 masked.init, jax.random.key(0), MODELS["cnn"][1])


@pytest.mark.slow  # compiles for a 2x4 mesh (~10 s)
def test_sharded_forward_backward_equals_unsharded():
  """A bayesianized flax MLP on a 2x4 (data, model) mesh, fsdp_tp rules: the logical axes
  the flax model gave its kernels place kernel_loc and kernel_scale, and sampling with the
  same key gives the same loss and gradients as on one device."""
  model = bayesianize(MLP(nn.Dense), "flipout")
  x = jax.random.normal(jax.random.key(0), (8, 8))
  y = jax.random.randint(jax.random.key(1), (8,), 0, 4)

  grads, shardings = sharded_grads_equal_unsharded(model, x, y)
  assert shardings["hidden"]["kernel_scale"].spec == P("data", "model")
  assert grads["hidden"]["kernel_loc"].sharding == shardings["hidden"]["kernel_loc"]


class CharLSTM(nn.Module):
  """A flax LSTM language model: nn.RNN over nn.LSTMCell, then nn.Dense."""

  @nn.compact
  def __call__(self, x):
    h = nn.RNN(nn.LSTMCell(8), split_rngs={"params": False, "sample": False})(x)
    return nn.Dense(3)(h)


def test_bayesianize_an_lstm_model_scanned_by_nn_rnn():
  """nn.LSTMCell inside nn.RNN becomes LSTMCellFlipout: its eight dense maps get
  posteriors, MOPED's posterior mean gives the original outputs exactly, samples differ."""
  x = jax.random.normal(jax.random.key(0), (2, 5, 4))
  model = CharLSTM()
  trained = model.init(jax.random.key(1), x)
  bayes = layers.bayesianize(model, "flipout")
  variables = layers.moped_init(bayes, trained, x)
  cell = nn.unbox(variables["params"])["LSTMCell_0"]
  assert sorted(cell) == ["hf", "hg", "hi", "ho", "if", "ig", "ii", "io"]
  assert cell["hi"]["kernel_scale"].shape == (8, 8) and "bias" in cell["hi"]
  assert cell["ii"]["kernel_loc"].shape == (4, 8)
  np.testing.assert_array_equal(bayes.clone(deterministic=True).apply(variables, x),
                                model.apply(trained, x))
  sampled = bayes.apply(variables, x, rngs={"sample": jax.random.key(3)})
  assert float(jnp.abs(sampled - model.apply(trained, x)).max()) > 1e-3
