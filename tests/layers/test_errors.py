"""Bad input gets one clear line naming the bad value and what would be valid."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from meshbayes import layers
from tests.layers.fixtures import one_line_error


def test_sampling_without_a_sample_rng():
  layer = layers.DenseFlipout(4, name="proj")
  x = jnp.ones((2, 3))
  variables = layer.init(jax.random.key(0), x)  # init needs no 'sample' rng
  one_line_error(r"DenseFlipout 'proj' samples its weights and needs a 'sample' rng: pass "
                 r"rngs=\{'sample': key\} to apply, or use the posterior mean: the layer's "
                 r"deterministic=True \(a bayesianize'd model: model.clone\(deterministic=True\)\)",
                 layer.apply, variables, x)
  # What the message says works, for a bayesianize'd model too.
  layer.apply(variables, x, deterministic=True)
  mlp = layers.bayesianize(nn.Dense(4), "flipout")
  mlp_variables = mlp.init(jax.random.key(0), x)
  one_line_error("model.clone", mlp.apply, mlp_variables, x)
  mlp.clone(deterministic=True).apply(mlp_variables, x)
  embed = layers.EmbedReparameterization(5, 2)
  ids = jnp.array([1, 2])
  one_line_error("needs a 'sample' rng", embed.apply, embed.init(jax.random.key(0), ids), ids)


def test_kernel_axes_of_the_wrong_length():
  layer = layers.DenseGeneralFlipout((2, 4), kernel_axes=("embed", "heads"), name="query")
  one_line_error(r"DenseGeneralFlipout 'query': kernel axes \('embed', 'heads'\) name 2 "
                 r"dimensions but kernel has shape \(3, 2, 4\); give one logical axis name",
                 layer.init, jax.random.key(0), jnp.ones((1, 3)))


def test_kernel_axes_that_disagree_with_a_boxed_initializer():
  init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
  layer = layers.DenseLocalReparameterization(4, kernel_init=init, kernel_axes=("mlp", "embed"))
  one_line_error(r"kernel_axes=\('mlp', 'embed'\) disagrees with the axes \('embed', 'mlp'\)",
                 layer.init, jax.random.key(0), jnp.ones((1, 3)))


def test_bad_features_and_ids():
  one_line_error(r"features=0 must be a positive int", layers.DenseReparameterization(0).init,
                 jax.random.key(0), jnp.ones((1, 3)))
  embed = layers.EmbedReparameterization(5, 2)
  one_line_error("inputs must be integer ids, got dtype float32", embed.init, jax.random.key(0),
                 jnp.ones((2,)))
  one_line_error(r"num_embeddings=0", layers.EmbedReparameterization(0, 2).init,
                 jax.random.key(0), jnp.array([0]))


@pytest.mark.parametrize("make, match", [
    (lambda: layers.NormalPrior(stddev=0.0), r"NormalPrior: stddev=0.0 must be a positive"),
    (lambda: layers.ScaleMixtureNormalPrior(mix=1.5), r"mix=1.5 must lie in \(0, 1\)"),
    (lambda: layers.ScaleMixtureNormalPrior(stddev2=-1.0), r"stddev2=-1.0 must be a positive"),
    (lambda: layers.ScaleMixtureNormalPrior(num_samples=0), r"num_samples=0 must be a positive int"),
    (lambda: layers.TrainableNormalPrior(init_stddev=0.0), r"init_stddev=0.0 must be a positive"),
    (lambda: layers.fan_in_stddev(0.0), r"ratio=0.0 must be a positive"),
    (lambda: layers.constant_stddev(-0.1), r"value=-0.1 must be a positive"),
])
def test_bad_prior_and_initializer_settings(make, match):
  one_line_error(match, make)
