"""The Transformer's parameters: Bayesian versus deterministic, and every preset's size."""

import math
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from meshbayes.layers import KL_COLLECTION, count_parameters, normal_kl, total_kl
from meshbayes.models.configurables import preset_config
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import Estimators, Transformer, TransformerConfig

SHAPES = {name: (2, 8) for name in ("encoder_input_tokens", "decoder_input_tokens",
                                    "decoder_target_tokens", "decoder_loss_weights")}
TINY = TransformerConfig(vocab_size=32, emb_dim=32, num_heads=2, head_dim=16,
                         num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64, dropout_rate=0.0)


def abstract_params(config):
  model = EncoderDecoderModel(config, num_train_units=1)
  return jax.eval_shape(lambda k: model.get_initial_variables(k, SHAPES),
                        jax.random.key(0))["params"]


def flat_specs(config):
  specs = nn.get_partition_spec(abstract_params(config))
  shapes = jax.tree.map(lambda x: x.shape, nn.unbox(abstract_params(config)))
  return {k: (shapes_v, traverse_util.flatten_dict(specs)[k])
          for k, shapes_v in traverse_util.flatten_dict(shapes).items()}


@pytest.mark.parametrize("scan_layers", [True, False])
def test_bayesian_model_has_loc_and_scale_in_place_of_each_bayesian_kernel(scan_layers):
  deterministic = flat_specs(TINY.replace(estimators=Estimators.deterministic(),
                                          scan_layers=scan_layers))
  bayesian = flat_specs(TINY.replace(scan_layers=scan_layers))
  expected = {}
  for path, value in deterministic.items():
    is_bayesian = path[-1] == "kernel" and any(
        part in ("attention", "self_attention", "encoder_decoder_attention", "mlp")
        for part in path)
    if is_bayesian:
      expected[path[:-1] + ("kernel_loc",)] = value
      expected[path[:-1] + ("kernel_scale",)] = value
    else:
      expected[path] = value
  assert bayesian == expected
  # Every parameter is annotated; scanned layers carry the 'layers' axis first.
  query = ("encoder", "layers", "attention", "query", "kernel_scale") if scan_layers else (
      "encoder", "layers_0", "attention", "query", "kernel_scale")
  assert tuple(bayesian[query][1]) == (("layers",) if scan_layers else ()) + (
      "embed", "heads", "kv")


def test_all_deterministic_is_exactly_the_deterministic_transformer():
  params = abstract_params(TINY.replace(estimators=Estimators.deterministic()))
  names = {path[-1] for path in traverse_util.flatten_dict(nn.unbox(params))}
  assert names == {"embedding", "kernel", "scale", "rel_embedding"}
  counts = count_parameters(params)
  assert counts.total == counts.point_weights == closed_form_counts(TINY)[0]


def closed_form_counts(c: TransformerConfig) -> tuple[int, int]:
  """(deterministic, variational) parameter counts of a preset, from its shapes alone.

  Bayesian weights (paper defaults) are the attention and feed-forward
  kernels; each gets a scale as well as a mean.
  """
  d, heads_kv, f = c.emb_dim, c.num_heads * c.head_dim, c.mlp_dim
  attention = 4 * d * heads_kv
  mlp = (len(c.mlp_activations) + 1) * d * f
  encoder_layer, decoder_layer = attention + mlp, 2 * attention + mlp
  bayesian = c.num_encoder_layers * encoder_layer + c.num_decoder_layers * decoder_layer
  norms = d * (2 * c.num_encoder_layers + 3 * c.num_decoder_layers + 2)
  relpos = 2 * c.num_heads * c.relpos_num_buckets
  embeddings = c.vocab_size * d * (1 if c.logits_via_embedding else 2)
  deterministic = bayesian + norms + relpos + embeddings
  return deterministic, deterministic + bayesian


@pytest.mark.parametrize("name, deterministic_approx, variational_approx", [
    ("tiny", None, None),
    ("small", 77e6, None),    # T5 v1.1 small: 77M
    ("base", 248e6, None),    # T5 v1.1 base: 248M
    ("large", 783e6, None),   # T5 v1.1 large: 783M
    ("paper", 2.85e9, 5.67e9),
    ("10b", None, 9.9e9),
])
def test_preset_parameter_counts_match_the_closed_form(name, deterministic_approx,
                                                       variational_approx):
  config = preset_config(name)
  counts = count_parameters(abstract_params(config))  # shapes only: nothing is allocated
  deterministic, variational = closed_form_counts(config)
  assert counts.deterministic_equivalent == deterministic
  assert counts.total == variational
  det_counts = count_parameters(abstract_params(preset_config(name, deterministic=True)))
  assert det_counts.total == det_counts.deterministic_equivalent == deterministic
  if deterministic_approx:
    assert math.isclose(deterministic, deterministic_approx, rel_tol=0.01)
  if variational_approx:
    assert math.isclose(variational, variational_approx, rel_tol=0.01)


def test_config_and_estimator_errors():
  with pytest.raises(ValueError, match="Estimators: mlp='dropout' is not one of deterministic, "
                                       "reparameterization, flipout, local_reparameterization"):
    Estimators(mlp="dropout")
  with pytest.raises(ValueError, match=r"mlp_activations=\('swish',\) must be"):
    TransformerConfig(mlp_activations=("swish",))
  with pytest.raises(ValueError, match="num_heads=0 must be a positive int"):
    TransformerConfig(num_heads=0)
  with pytest.raises(ValueError, match="remat_policy='some' must be one of"):
    TransformerConfig(remat_policy="some")
  with pytest.raises(ValueError, match="one_sample_per_sequence names 'logits'; components"):
    TransformerConfig(one_sample_per_sequence=("logits",))
  with pytest.raises(ValueError, match="'mlp', whose estimator local_reparameterization"):
    TransformerConfig(one_sample_per_sequence=("mlp",))
  with pytest.raises(ValueError, match=r"prior='laplace' must be one of \('normal', 'fan_in'"):
    TransformerConfig(prior="laplace")


@pytest.mark.parametrize("prior", ["fan_in", pytest.param("empirical_bayes",
                                                         marks=pytest.mark.slow)])
def test_a_fan_in_prior_gives_each_kernel_the_kl_of_its_own_fan_in(prior):
  """Attention's query takes embed inputs, its out projection heads x kv; the feed-forward
  wi takes embed, wo mlp: each kernel's KL is against N(0, c^2 / its fan-in)."""
  config = TINY.replace(num_encoder_layers=1, num_decoder_layers=1, prior=prior,
                        prior_stddev=0.5)
  module = Transformer(config)
  tokens = jnp.ones((2, 6), jnp.int32)
  params = nn.unbox(module.init(jax.random.key(0), tokens, tokens)["params"])
  flat = traverse_util.flatten_dict(params)
  if prior == "empirical_bayes":  # each tensor's trainable prior starts at its fan-in's scale
    np.testing.assert_allclose(
        jax.nn.softplus(flat[("encoder", "layers", "mlp", "wo", "kernel_prior_scale")]),
        0.5 / math.sqrt(64), rtol=1e-6)
  flat = {k: v + 0.01 * jax.random.normal(jax.random.key(len(k)), v.shape)
          if k[-1] in ("kernel_loc", "kernel_scale") else v for k, v in flat.items()}
  _, state = module.apply({"params": traverse_util.unflatten_dict(flat)}, tokens, tokens,
                          deterministic=True, mutable=[KL_COLLECTION])
  fan_ins = {"query": 32, "key": 32, "value": 32, "out": 2 * 16, "wi_0": 32, "wi_1": 32,
             "wo": 64}
  expected = sum(
      float(jnp.sum(normal_kl(loc, jax.nn.softplus(flat[path[:-1] + ("kernel_scale",)]), 0.0,
                              0.5 / math.sqrt(fan_ins[path[-2]]))))
      for path, loc in flat.items() if path[-1] == "kernel_loc")
  assert float(total_kl(state)) == pytest.approx(expected, rel=1e-5)


def test_one_sample_per_sequence_makes_a_sentences_positions_share_the_attention_sample():
  """Flipout attention with one_sample_per_sequence: a sequence whose positions repeat
  one token (no position signal but T5's relative bias, zeroed here) gets identical
  outputs at every position under any sample, as one weight sample gives; per-position
  signs make them differ. Same parameters either way."""
  base = TINY.replace(estimators=Estimators(attention="flipout", cross_attention="flipout",
                                            mlp="deterministic"), num_encoder_layers=1,
                      num_decoder_layers=1)
  tokens = jnp.full((2, 8), 5, jnp.int32)

  def encoded(config):
    module = Transformer(config)
    params = module.init(jax.random.key(0), tokens, tokens, tokens)["params"]
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if "rel_embedding" in jax.tree_util.keystr(path)
        else x, nn.unbox(params))
    return module.apply({"params": params}, tokens, method=Transformer.encode,
                        rngs={"sample": jax.random.key(1)})

  shared = encoded(base.replace(one_sample_per_sequence=("attention",)))
  assert float(jnp.abs(shared - shared[:, :1]).max()) < 1e-5
  assert float(jnp.abs(shared[0] - shared[1]).max()) > 1e-3  # examples differ
  per_position = encoded(base)
  assert float(jnp.abs(per_position - per_position[:, :1]).max()) > 1e-3


@pytest.mark.slow  # compiles the model three ways
def test_remat_and_bfloat16_run():
  config = TINY.replace(remat_policy="minimal", dtype="bfloat16")
  model = Transformer(config)
  tokens = jnp.ones((2, 6), jnp.int32)
  params = jax.jit(lambda k: nn.unbox(model.init(k, tokens, tokens)["params"]))(jax.random.key(0))
  grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, tokens, tokens,
                                                 rngs={"sample": jax.random.key(1)}).sum()))(
                                                     params)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


@pytest.mark.integration
def test_model_sizes_tool(capsys):
  import importlib.util
  from pathlib import Path

  path = Path(__file__).resolve().parents[2] / "tools" / "model_sizes.py"
  spec = importlib.util.spec_from_file_location("model_sizes", path)
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  (row,) = tool.main(["--presets=paper"])
  assert row["deterministic"] == closed_form_counts(preset_config("paper"))[0]
  assert "2,851,381,248" in capsys.readouterr().out


# The presets' `include 'models/transformer.gin'` is searched for in the working directory
# first; from a directory other than the repository's, gin's package-path reader used to log
# `ERROR:root:Path not found: models/transformer.gin` although the preset loaded.
_PRESET_FROM_ELSEWHERE = """
import logging
logging.basicConfig(level=logging.WARNING)
from meshbayes.scaling.aot import StepSpec
config = StepSpec(model="tiny", deterministic=True).config()
print(config.emb_dim, config.estimators.mlp, config.estimators.attention)
"""


@pytest.mark.integration
def test_a_preset_loads_from_another_directory_without_false_errors(tmp_path):
  result = subprocess.run([sys.executable, "-c", _PRESET_FROM_ELSEWHERE], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  # tiny.gin's size, and deterministic.gin's estimators: applied only through the
  # @models.Estimators() that the included transformer.gin binds.
  assert result.stdout.split() == ["32", "deterministic", "deterministic"]
  assert "Path not found" not in result.stderr, result.stderr[-2000:]
