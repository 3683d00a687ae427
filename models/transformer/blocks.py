"""Transformer blocks: normalization, relative position bias, attention (with a key/value
cache for decoding) and feed-forward. Every parameter and block-boundary activation carries
logical axis names; each projection's Bayesian estimator is a constructor argument.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from meshbayes.layers import (
    NormalPrior,
    Prior,
    TrainableNormalPrior,
    dense_general_class,
    fan_in_stddev,
)
from meshbayes.layers.attention import attention_class
from meshbayes.models.transformer.config import GROUPED, TransformerConfig

Array = jax.Array

_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": nn.relu, "gelu": functools.partial(nn.gelu, approximate=True), "silu": nn.silu,
    "linear": lambda x: x,
}
BATCH_LENGTH_EMBED = ("batch", "length", "embed")


def compute_dtype(config: TransformerConfig):
  return jnp.dtype(config.dtype)


def weight_prior(config: TransformerConfig) -> Prior:
  """The prior of the Bayesian weights that ``config.prior`` names."""
  if config.prior == "empirical_bayes":
    return TrainableNormalPrior(init_stddev=config.prior_stddev, fan_in_scaled=True)
  return NormalPrior(stddev=config.prior_stddev, fan_in_scaled=config.prior == "fan_in")


def dense_general(config: TransformerConfig, estimator: str, **kwargs) -> nn.Module:
  """A bias-free ``DenseGeneral`` of the given estimator with the model's posterior settings."""
  return dense_general_class(estimator)(
      use_bias=False, dtype=compute_dtype(config),
      kernel_stddev_init=fan_in_stddev(config.posterior_stddev_ratio),
      prior=weight_prior(config), **kwargs)


def weight_groups(config: TransformerConfig, component: str, deterministic: bool) -> int:
  """The weight samples per call of a component's layers: ``num_weight_groups`` where its
  estimator is the grouped reparameterization and it samples, else 1 (the other estimators
  refuse any other value, and the posterior mean, one pass, takes a batch of any size)."""
  if deterministic or getattr(config.estimators, component) != GROUPED:
    return 1
  return config.num_weight_groups


class RMSNorm(nn.Module):
  """T5's layer norm: scale by the root mean square, no centring, no bias."""

  dtype: jnp.dtype = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             ("embed",)),
                       (x.shape[-1],), jnp.float32)
    return (y * scale).astype(self.dtype)


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
  """T5's buckets: exact for small distances, logarithmic up to ``max_distance``.

  Args:
    relative_position: key position minus query position.
    bidirectional: separate buckets for keys before and after the query.
    num_buckets: number of buckets.
    max_distance: distances beyond it share the last bucket.

  Returns:
    int32 bucket ids, shaped like ``relative_position``.
  """
  bucket = jnp.zeros_like(relative_position)
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    bucket = bucket + (n < 0).astype(jnp.int32) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  large = max_exact + (jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps)
                       / math.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(n < max_exact, n, large)


class RelativePositionBias(nn.Module):
  """A learned scalar per (head, bucket), added to attention logits."""

  num_heads: int
  num_buckets: int
  max_distance: int
  bidirectional: bool

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array) -> Array:
    """``(1, heads, queries, keys)`` biases for 1-D position vectors."""
    table = self.param("rel_embedding", nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), ("heads", "relpos_buckets")),
                       (self.num_heads, self.num_buckets), jnp.float32)
    buckets = relative_position_bucket(key_positions[None, :] - query_positions[:, None],
                                       self.bidirectional, self.num_buckets, self.max_distance)
    return jnp.take(table, buckets, axis=1)[None]


def _weighted_values(subscripts: str, weights: Array, value: Array) -> Array:
  return jnp.einsum(subscripts, weights.astype(value.dtype), value)


# flax's attention with the logits accumulated (and, with force_fp32_for_softmax, normalized)
# in float32 whatever the compute dtype; the weights return to it before meeting the values.
_float32_logits_attention = functools.partial(
    nn.dot_product_attention,
    qk_attn_weights_einsum=functools.partial(jnp.einsum, preferred_element_type=jnp.float32),
    attn_weights_value_einsum=_weighted_values)


def _cudnn_attention(query: Array, key: Array, value: Array, bias: Array | None = None,
                     mask: Array | None = None, dtype=None) -> Array:
  """cuDNN's fused attention: logits and softmax in float32 on chip, the scores never
  written out (NVIDIA GPUs; ``TransformerConfig.attention_kernel='cudnn'``)."""
  dtype = dtype or query.dtype
  query, key, value = (x.astype(dtype) for x in (query, key, value))
  return jax.nn.dot_product_attention(
      query, key, value, bias=None if bias is None else bias.astype(dtype), mask=mask,
      implementation="cudnn")


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention with Bayesian projections: the public layer, configured.

  ``meshbayes.layers.attention``'s layer of the given estimator, sharing this
  module's scope, so its ``query``, ``key``, ``value`` and ``out`` (and the
  ``decode`` cache) sit directly under this module. In ``decode`` mode keys
  and values are kept in a ``'cache'`` collection and the inputs are one
  position at a time: the first call (on a full-length dummy input) only
  creates the cache.

  Attributes:
    config: the model configuration.
    component: ``attention`` or ``cross_attention``: which of the config's
      estimators (and ``one_sample_per_sequence``) the four projections take.
    enable_dropout: dropout on attention weights.
    deterministic: Bayesian projections use their posterior mean.
    decode: incremental decoding with a key/value cache.
  """

  config: TransformerConfig
  component: str
  enable_dropout: bool = False
  deterministic: bool = False
  decode: bool = False

  def setup(self):
    cfg = self.config
    self.attention = attention_class(getattr(cfg.estimators, self.component))(
        num_heads=cfg.num_heads, qkv_features=cfg.num_heads * cfg.head_dim,
        out_features=cfg.emb_dim, dtype=compute_dtype(cfg), use_bias=False,
        kernel_init=nn.initializers.variance_scaling(1.0, "fan_in", "normal"),
        # Dropout only under enable_dropout. The layer also drops nothing when deterministic
        # (posterior mean), a combination training never asks for.
        dropout_rate=(cfg.dropout_rate if cfg.attention_dropout_rate is None
                      else cfg.attention_dropout_rate) if self.enable_dropout else 0.0,
        broadcast_dropout=False,
        deterministic=self.deterministic, decode=self.decode,
        # The decode cache's one-position queries always take XLA's attention.
        attention_fn=(_cudnn_attention if cfg.attention_kernel == "cudnn" and not self.decode
                      else _float32_logits_attention), force_fp32_for_softmax=True,
        activation_axes=("batch", "length", "heads", "kv"),
        kernel_stddev_init=fan_in_stddev(cfg.posterior_stddev_ratio),
        prior=weight_prior(cfg),
        one_sample_per_example=self.component in cfg.one_sample_per_sequence,
        noise_dtype=cfg.noise_dtype,
        num_weight_groups=weight_groups(cfg, self.component, self.deterministic))
    nn.share_scope(self, self.attention)

  def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Array | None,
               bias: Array | None) -> Array:
    out = self.attention(inputs_q, inputs_kv, mask=mask, bias=bias)
    return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)


class MlpBlock(nn.Module):
  """The feed-forward block: ``wo(act_0(wi_0 x) * act_1(wi_1 x) ...)``.

  Attributes:
    config: the model configuration (width, activations, dropout).
    enable_dropout: dropout on the hidden activations.
    deterministic: Bayesian projections use their posterior mean.
  """

  config: TransformerConfig
  enable_dropout: bool = False
  deterministic: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    sampling = {"one_sample_per_example": "mlp" in cfg.one_sample_per_sequence,
                "noise_dtype": cfg.noise_dtype,
                "num_weight_groups": weight_groups(cfg, "mlp", self.deterministic)}
    hidden = None
    for i, activation in enumerate(cfg.mlp_activations):
      name = "wi" if len(cfg.mlp_activations) == 1 else f"wi_{i}"
      h = dense_general(cfg, cfg.estimators.mlp, features=cfg.mlp_dim, kernel_init=init,
                        kernel_axes=("embed", "mlp"), name=name, **sampling)(
                            x, self.deterministic)
      h = _ACTIVATIONS[activation](h)
      hidden = h if hidden is None else hidden * h
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    hidden = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(
        hidden, deterministic=not self.enable_dropout)
    out = dense_general(cfg, cfg.estimators.mlp, features=cfg.emb_dim, kernel_init=init,
                        kernel_axes=("mlp", "embed"), name="wo", **sampling)(
                            hidden, self.deterministic)
    return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)
