"""The grouped reparameterization in the Transformer: ``Estimators``' attention and
feed-forward components take ``grouped_reparameterization``, and ``TransformerConfig.
num_weight_groups`` reaches exactly their layers (issue 70).

One group is reparameterization bit for bit; the KL is the posterior's, whatever the
estimator; a batch of identical examples gives each group its own outputs.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meshbayes.layers.attention import _Attention
from meshbayes.layers.dense import _Linear
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import Estimators, TransformerConfig
from tests.layers.fixtures import one_line_error
from tests.models.synthetic import make_batch

GROUPED = "grouped_reparameterization"
ALL_GROUPED = Estimators(attention=GROUPED, cross_attention=GROUPED, mlp=GROUPED)
ALL_REPARAMETERIZED = Estimators(attention="reparameterization",
                                 cross_attention="reparameterization", mlp="reparameterization")
TINY = TransformerConfig(vocab_size=32, emb_dim=16, num_heads=2, head_dim=8,
                         num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                         dropout_rate=0.0)
BATCH = make_batch(np.random.default_rng(0), 4, 8, 32)
SHAPES = {name: value.shape for name, value in BATCH.items()}


def _model(estimators, k=1, **changes):
  return EncoderDecoderModel(TINY.replace(estimators=estimators, num_weight_groups=k, **changes),
                             num_train_units=1e4)


def _params(model):
  return jax.jit(lambda key: nn.unbox(model.get_initial_variables(key, SHAPES)["params"]))(
      jax.random.key(0))


def test_the_attention_and_feed_forward_components_take_the_grouped_estimator():
  assert ALL_GROUPED.grouped == ("attention", "cross_attention", "mlp")
  assert Estimators(mlp=GROUPED).grouped == ("mlp",) and Estimators().grouped == ()
  for component in ("embedding", "logits"):
    one_line_error(rf"Estimators: {component}='grouped_reparameterization' is not one of "
                   r"deterministic, reparameterization, flipout, local_reparameterization "
                   r"\(grouped_reparameterization is for attention, cross_attention, mlp only\)",
                   Estimators, **{component: GROUPED})
  one_line_error(r"Estimators: mlp='grouped' is not one of deterministic, reparameterization, "
                 r"flipout, local_reparameterization, grouped_reparameterization$",
                 Estimators, mlp="grouped")


@pytest.mark.parametrize("value", [0, -2, True, 2.0, "4"])
def test_num_weight_groups_must_be_a_positive_int(value):
  one_line_error(rf"TransformerConfig: num_weight_groups={value!r} must be a positive int$",
                 TINY.replace, estimators=ALL_GROUPED, num_weight_groups=value)


def test_num_weight_groups_needs_a_grouped_component():
  one_line_error(r"TransformerConfig: num_weight_groups=4 needs a component \(attention, "
                 r"cross_attention, mlp\) whose estimator is grouped_reparameterization; with "
                 r"none it must be 1", TINY.replace, num_weight_groups=4)


def _weight_groups(config, deterministic=False):
  """Each Bayesian attention and Dense layer the model builds: path -> (class, groups)."""
  seen = {}

  def record(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, (_Linear, _Attention)) and module.estimator is not None:
      seen["/".join(module.path)] = (module.estimator, module.num_weight_groups)
    return next_fun(*args, **kwargs)

  model = EncoderDecoderModel(config, num_train_units=1e4)

  def apply():
    variables = model.get_initial_variables(jax.random.key(0), SHAPES)
    seen.clear()  # the call's layers, not init's
    return model.module.apply(variables, BATCH["encoder_input_tokens"],
                              BATCH["decoder_input_tokens"], deterministic=deterministic,
                              rngs={"sample": jax.random.key(1)})

  with nn.intercept_methods(record):
    jax.eval_shape(apply)
  return seen


def test_num_weight_groups_reaches_the_grouped_components_layers_only():
  config = TINY.replace(estimators=Estimators(attention=GROUPED, cross_attention="flipout",
                                              mlp=GROUPED), num_weight_groups=2)
  seen = _weight_groups(config)
  # Per side: self-attention with its four projections, the gated feed-forward's three
  # matrices; the decoder's cross-attention and its four.
  assert len(seen) == 2 * (1 + 4 + 3) + (1 + 4)
  for path, (estimator, groups) in seen.items():
    cross = "encoder_decoder_attention" in path
    assert (estimator, groups) == (("flipout", 1) if cross else (GROUPED, 2)), path
  # The posterior mean has no groups: any batch goes.
  assert {groups for _, groups in _weight_groups(config, deterministic=True).values()} == {1}


def test_one_group_is_the_reparameterization_bit_for_bit_and_the_kl_is_the_posteriors():
  grouped, reparameterized = _model(ALL_GROUPED), _model(ALL_REPARAMETERIZED)
  params = _params(grouped)
  rng = jax.random.key(3)
  loss, metrics = jax.jit(grouped.loss_fn)(params, BATCH, rng)
  want, want_metrics = jax.jit(reparameterized.loss_fn)(params, BATCH, rng)
  assert float(loss) == float(want) and float(metrics["kl"]) == float(want_metrics["kl"])
  # At four groups: other samples, so another loss; the same KL to the last bit.
  loss4, metrics4 = jax.jit(_model(ALL_GROUPED, 4).loss_fn)(params, BATCH, rng)
  assert float(loss4) != float(want)
  assert float(metrics4["kl"]) == float(want_metrics["kl"]) > 0


def test_each_group_sees_its_own_sample():
  """Four identical examples: one logits for all at one group; two at two groups."""
  tokens = {name: np.repeat(value[:1], 4, axis=0) for name, value in BATCH.items()}

  def logits(k):
    model = _model(ALL_GROUPED, k)
    return jax.jit(lambda p: model.module.apply(
        {"params": p}, tokens["encoder_input_tokens"], tokens["decoder_input_tokens"],
        rngs={"sample": jax.random.key(4)}))(_params(model))

  one, two = logits(1), logits(2)
  np.testing.assert_array_equal(one[1:], np.broadcast_to(one[:1], one[1:].shape))
  np.testing.assert_array_equal(two[1], two[0])
  np.testing.assert_array_equal(two[3], two[2])
  assert np.abs(two[2] - two[0]).max() > 1e-3


def test_a_grouped_transformer_trains_with_finite_losses():
  model = _model(ALL_GROUPED, 2)
  params = _params(model)
  optimizer = optax.adam(3e-3)

  @jax.jit
  def step(params, opt_state, i):
    (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(
        params, BATCH, jax.random.fold_in(jax.random.key(1), i))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state, losses = optimizer.init(params), []
  for i in range(4):
    params, opt_state, loss = step(params, opt_state, i)
    losses.append(float(loss))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_a_batch_the_groups_do_not_divide_is_one_line_and_the_posterior_mean_takes_it():
  model = _model(ALL_GROUPED, 2)
  params = _params(model)
  odd = {name: value[:3] for name, value in BATCH.items()}
  one_line_error(r"num_weight_groups=2 does not divide the batch of 3 examples",
                 model.loss_fn, params, odd, jax.random.key(0))
  _, metrics = model.eval_fn(params, odd)  # the posterior mean: no groups
  assert np.isfinite(float(metrics["nll"]))
