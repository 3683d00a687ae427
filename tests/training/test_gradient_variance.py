"""The ELBO gradient's variance over weight-noise draws (``training.gradient_variance``).

Checked against closed forms on one Dense layer of ``B`` identical examples ``x``, no bias,
loss = the sum of the outputs, scale ``s`` (stddev ``softplus(s)``, so ``d stddev / ds =
sigmoid(s)``):

- grouped reparameterization at ``k`` groups: ``dL/ds_ij = (B/k) x_i sigmoid(s_ij) sum_g
  eps_gij``, so ``Var = B^2 x_i^2 sigmoid(s_ij)^2 / k``: ``k Var(k) / Var(1) = 1`` exactly in
  expectation; ``dL/dloc_ij = B x_i`` has no noise at all;
- local reparameterization: ``y_bj = x . loc_j + sqrt(v_j) z_bj``, ``v_j = sum_i x_i^2
  stddev_ij^2``, so ``dL/ds_ij = x_i^2 stddev_ij sigmoid(s_ij) / sqrt(v_j) sum_b z_bj`` and
  ``Var = B x_i^4 stddev_ij^2 sigmoid(s_ij)^2 / v_j``.

The gradients are Gaussian in the noise, so an element's unbiased variance over ``D`` draws
has standard error ``sqrt(2 / (D - 1))`` times its variance; a group's mean over independent
elements divides that by about ``sqrt(elements)``, and over correlated ones (local
reparameterization's elements of one output share ``z``) it is at most that of one element.
The checks allow 5 standard errors.
"""

from __future__ import annotations

import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.layers import DenseGroupedReparameterization, DenseLocalReparameterization
from meshbayes.layers.bayesianize import bayesianize
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import Estimators, TransformerConfig
from meshbayes.tools import gradient_variance as tool
from meshbayes.training import gradient_variance
from tests.layers.fixtures import one_line_error
from tests.models.synthetic import make_batch

GROUPED = "grouped_reparameterization"
BATCH, IN, OUT = 8, 3, 4
NUM_DRAWS = 2000
X = jnp.tile(jnp.array([[0.5, -1.0, 2.0]]), (BATCH, 1))  # identical examples


def _layer(family, k):
  """The grouped layer by class, or ``nn.Dense`` made grouped by ``bayesianize``."""
  if family == "bayesianized":
    return bayesianize(nn.Dense(OUT, use_bias=False), {"Dense": GROUPED}, num_weight_groups=k)
  return DenseGroupedReparameterization(OUT, use_bias=False, num_weight_groups=k)


def _params(layer, x):
  params = layer.init(jax.random.key(0), x)["params"]
  # Stddevs of a few tenths, different per element, so the closed forms are not flat.
  scale = jax.random.uniform(jax.random.key(1), (IN, OUT), minval=-2.0, maxval=0.0)
  return {**params, "kernel_scale": scale}


def _sum_loss(layer, x):
  return lambda params, key: jnp.sum(layer.apply({"params": params}, x, rngs={"sample": key}))


def _standard_error(expected, independent):
  """Of a group's mean per-element variance estimated from ``NUM_DRAWS`` Gaussian draws."""
  expected = np.asarray(expected, np.float64).ravel()
  if independent:
    return math.sqrt(2 * np.sum(expected ** 2) / (NUM_DRAWS - 1)) / expected.size
  return np.mean(expected) * math.sqrt(2 / (NUM_DRAWS - 1))


@pytest.mark.parametrize("family", ["layer", "bayesianized"])
def test_grouped_variance_falls_as_one_over_k(family):
  params = _params(_layer(family, 1), X)
  sigmoid = np.asarray(jax.nn.sigmoid(params["kernel_scale"]), np.float64)
  x = np.asarray(X[0], np.float64)[:, None]
  variance = {}
  for k in (1, 2, 8):  # 8: one sample per example
    figures = gradient_variance.gradient_variance(_sum_loss(_layer(family, k), X), params,
                                                  NUM_DRAWS, seed=k)["groups"]
    assert figures["kernel_loc"]["variance"] == 0.0  # dL/dloc = B x: no noise
    expected = BATCH ** 2 * x ** 2 * sigmoid ** 2 / k
    error = _standard_error(expected, independent=True)
    assert abs(figures["kernel_scale"]["variance"] - expected.mean()) <= 5 * error
    variance[k] = (figures["kernel_scale"]["variance"], error / expected.mean())
  for k in (2, 8):
    ratio = k * variance[k][0] / variance[1][0]
    assert abs(ratio - 1.0) <= 5 * (variance[k][1] + variance[1][1]), (k, ratio)


def test_local_reparameterization_variance_has_its_closed_form():
  layer = DenseLocalReparameterization(OUT, use_bias=False)
  params = _params(layer, X)
  stddev = np.asarray(jax.nn.softplus(params["kernel_scale"]), np.float64)
  sigmoid = np.asarray(jax.nn.sigmoid(params["kernel_scale"]), np.float64)
  x = np.asarray(X[0], np.float64)[:, None]
  v = np.sum(x ** 2 * stddev ** 2, axis=0, keepdims=True)
  expected = BATCH * x ** 4 * stddev ** 2 * sigmoid ** 2 / v
  figures = gradient_variance.gradient_variance(_sum_loss(layer, X), params, NUM_DRAWS)
  scale = figures["groups"]["kernel_scale"]
  assert abs(scale["variance"] - expected.mean()) <= 5 * _standard_error(expected, False)
  assert figures["groups"]["kernel_loc"]["variance"] == 0.0
  # Not the grouped estimator's per-example variance, B x_i^2 sigmoid^2: a different law.
  assert abs(expected.mean() / np.mean(BATCH * x ** 2 * sigmoid ** 2) - 1) > 0.3


def test_the_order_of_examples_within_a_group_does_not_matter():
  x = jax.random.normal(jax.random.key(3), (BATCH, IN))
  layer = _layer("layer", 2)
  params = _params(layer, x)
  within = jnp.array([3, 1, 0, 2, 6, 7, 5, 4])  # each half of the batch permuted in place
  as_is, permuted = (gradient_variance.gradient_variance(_sum_loss(layer, inputs), params, 50)
                     for inputs in (x, x[within]))
  for group in ("kernel_loc", "kernel_scale"):
    for name in ("variance", "mean_gradient_sq_norm"):
      assert math.isclose(as_is["groups"][group][name], permuted["groups"][group][name],
                          rel_tol=1e-5), (group, name)
  # Across the groups the examples see other samples: another figure.
  across = gradient_variance.gradient_variance(_sum_loss(layer, x[::-1]), params, 50)
  assert not math.isclose(as_is["groups"]["kernel_scale"]["variance"],
                          across["groups"]["kernel_scale"]["variance"], rel_tol=1e-3)


TINY = TransformerConfig(vocab_size=32, emb_dim=16, num_heads=2, head_dim=8,
                         num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                         dropout_rate=0.1, scan_layers=False)
TOKENS = make_batch(np.random.default_rng(0), 4, 8, 32)


def test_a_deterministic_transformer_has_no_gradient_variance_and_groups_drop_layer_indices():
  """Dropout on, its masks held fixed: the trainer's loss varies with the sample key alone."""
  model = EncoderDecoderModel(TINY.replace(estimators=Estimators.deterministic()),
                              num_train_units=1e4)
  shapes = {name: value.shape for name, value in TOKENS.items()}
  params = nn.unbox(model.get_initial_variables(jax.random.key(0), shapes)["params"])
  loss = gradient_variance.trainer_loss(model, TOKENS, 1.0, jax.random.key(5))
  figures = gradient_variance.gradient_variance(loss, params, 3)
  assert {f["variance"] for f in figures["groups"].values()} == {0.0}
  assert set(figures["kinds"]) == {"attention_loc", "mlp_loc", "embedding", "other"}
  assert "decoder/layers/mlp/wi_0/kernel" in figures["groups"]  # from decoder/layers_0/...
  assert not any("layers_0" in group for group in figures["groups"])
  assert figures["kinds"]["mlp_loc"]["mean_gradient_sq_norm"] > 0
  # The trainer's loss at the same keys: the same number.
  expected, _ = model.loss_fn(params, TOKENS, jax.random.key(7))
  dropout, sample = jax.random.split(jax.random.key(7))
  assert float(gradient_variance.trainer_loss(model, TOKENS, 1.0, dropout)(params, sample)) \
      == float(expected)


def test_kinds_of_groups():
  kind = gradient_variance.kind_of
  assert kind("encoder/layers/attention/query/kernel_scale") == "attention_scale"
  assert kind("decoder/layers/encoder_decoder_attention/out/kernel_loc") == "attention_loc"
  assert kind("decoder/layers/mlp/wo/kernel") == "mlp_loc"
  assert kind("token_embedder/embedding") == "embedding"
  assert kind("decoder/layers/pre_mlp_norm/scale") == "other"
  assert kind("decoder/logits_dense/kernel") == "other"
  one_line_error(r"num_draws=1 must be an int >= 2", gradient_variance.gradient_variance,
                 lambda p, k: p, {}, 1)


TOY = ["--data=synthetic", "--batch_size=4", "--group_counts=2", "--num_draws=4",
       *(f"--binding=models.TransformerConfig.{name}" for name in (
           "emb_dim=16", "num_heads=2", "head_dim=8", "mlp_dim=32", "vocab_size=32",
           "num_encoder_layers=1", "num_decoder_layers=1", "scan_layers=False",
           "mlp_activations=('relu',)")),
       "--binding=models.EncoderDecoderModel.num_train_units=450000",
       "--binding=TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 8}"]


def test_the_tool_tabulates_each_estimator_at_toy_size(tmp_path, capsys):
  report = tool.main([*TOY, f"--json={tmp_path / 'gv.json'}"])
  rows = [row["estimator"] for row in report["rows"]]
  assert rows == ["deterministic", "paper", "reparameterization", "grouped k=2"]
  deterministic = report["rows"][0]
  assert {f["variance"] for f in deterministic["kinds"].values()} == {0.0}
  assert set(deterministic["kinds"]) == {"attention_loc", "attention_scale", "mlp_loc",
                                         "mlp_scale", "embedding", "other"}
  for row in report["rows"][1:]:
    assert all(f["variance"] > 0 for f in row["kinds"].values()), row["estimator"]
  assert {f["k_var_ratio"] for f in report["rows"][2]["kinds"].values()} == {1.0}
  assert {f["relative_to_paper"] for f in report["rows"][1]["kinds"].values()} == {1.0}
  assert report["setup"]["estimators"]["attention"] == "flipout"
  assert report["setup"]["batch_size"] == 4 and report["setup"]["params"] == "initialization"
  table = capsys.readouterr().out.splitlines()
  assert table[0].startswith("| kind | estimator | elements | variance | SNR |")
  assert len(table) == 2 + 6 * 4
  assert table[2].startswith("| attention_loc | deterministic | ") and " | 0 | inf | - | 0 |" \
      in table[2]
  written = json.loads((tmp_path / "gv.json").read_text())  # strict: the infinite SNR is null
  assert written["rows"][0]["kinds"]["mlp_loc"]["snr"] is None
  assert written["null_reasons"]["rows/0/kinds/mlp_loc/snr"] == "inf: not a finite number"


def test_the_tool_refuses_a_group_count_that_does_not_divide_the_batch(capsys):
  with pytest.raises(SystemExit) as exit_:
    tool.main([*TOY, "--group_counts=3"])
  assert str(exit_.value) == ("gradient_variance: error: compare_estimators: group count 3 does "
                              "not divide the batch of 4 examples; use divisors of it")


@pytest.mark.skipif(not tool._prepared("tatoeba_enfr_20k"), reason="make data has not run")
def test_a_task_batch_is_drawn_at_random_from_the_pool_not_the_files_first_lines():
  """Tatoeba lists the translations of one sentence together: the first 32 lines hold few
  distinct sources, a draw from the first 64 batches almost only distinct ones."""
  from meshbayes.data.pipeline import TaskData
  from meshbayes.partitioning import DataLayout

  lengths = {"inputs": 32, "targets": 32}
  drawn = tool._task_batch("tatoeba_enfr_20k", lengths, 32, seed=0)
  np.testing.assert_array_equal(
      drawn["encoder_input_tokens"],
      tool._task_batch("tatoeba_enfr_20k", lengths, 32, seed=0)["encoder_input_tokens"])
  first = next(iter(TaskData("tatoeba_enfr_20k", lengths, 32, shuffle=False).eval_batches(
      DataLayout(32), "train")))
  distinct = lambda batch: len({row.tobytes() for row in np.asarray(batch["encoder_input_tokens"])})
  assert drawn["encoder_input_tokens"].shape[0] == 32
  assert distinct(first) <= 24 < 30 <= distinct(drawn), (distinct(first), distinct(drawn))
