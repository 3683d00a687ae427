"""Bayesian drop-ins for ``nn.MultiHeadDotProductAttention``, one class per estimator.

Each takes flax's arguments and call; ``query``, ``key``, ``value`` and ``out``
are ``DenseGeneral`` projections of the class's estimator, each recording its
KL. ``deterministic`` means posterior-mean projections and no dropout. Beyond
flax: ``bias`` on the logits and ``activation_axes``. ``MultiHeadDotProductAttention``
is the deterministic twin; ``attention_class(estimator)`` picks by name (any of
``DENSE_ESTIMATORS``: the projections are Dense layers).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from meshbayes.layers.dense import DENSE_ESTIMATORS, dense_general_class
from meshbayes.layers.initializers import constant_stddev, fan_in_stddev
from meshbayes.layers.priors import NormalPrior, Prior
from meshbayes.layers.variational import Axes, Initializer

Array = jax.Array


class _Attention(nn.Module):
  """The shared body of the attention layers; subclasses pick the estimator.

  Attributes:
    num_heads: number of attention heads; ``qkv_features`` must be a multiple.
    dtype: computation dtype (default: inferred from inputs and parameters).
    param_dtype: parameter dtype (float32 by default).
    qkv_features: size of the query, key and value, all heads together
      (default: the features of ``inputs_q``).
    out_features: size of the output (default: the features of ``inputs_q``).
    broadcast_dropout: share the attention dropout mask over the batch and
      head axes.
    dropout_rate: dropout rate of the attention weights.
    deterministic: posterior-mean projections and no dropout; the call
      argument overrides it (None: sample).
    precision: numerical precision of the matmuls (``jax.lax.Precision``).
    kernel_init: initializer of the projection kernels (their posterior means).
    out_kernel_init: initializer of the ``out`` kernel (default ``kernel_init``).
    bias_init: initializer of the projection biases.
    out_bias_init: initializer of the ``out`` bias (default ``bias_init``).
    use_bias: whether the projections add a bias.
    attention_fn: ``nn.dot_product_attention`` or a function with its
      signature; keyword arguments it lacks are not passed (``bias`` must be
      accepted when one is given).
    decode: incremental decoding with a key/value ``'cache'``: the first call
      (``init`` on a full-length input) creates the cache, each later call
      takes one position.
    normalize_qk: layer-normalize queries and keys (``query_ln``, ``key_ln``).
    force_fp32_for_softmax: compute the softmax in float32 under a lower
      precision ``dtype``.
    qkv_kernel_axes: logical axes of the query, key and value kernels
      ``(features, heads, head_dim)``; their biases take the last two (None:
      from a boxed ``kernel_init``, or unannotated).
    out_kernel_axes: logical axes of the ``out`` kernel ``(heads, head_dim,
      features)``; its bias takes the last one.
    activation_axes: logical axes of the projected queries, keys and values
      ``(batch, length, heads, head_dim)``, for a sharding constraint (None:
      none).
    kernel_stddev_init: initializer of each kernel's posterior standard
      deviation (default ``0.1 / sqrt(fan_in)``).
    bias_stddev_init: initializer of a Bayesian bias's standard deviation.
    bayesian_bias: give the biases normal posteriors too.
    prior: prior of every Bayesian weight (default N(0, 1)).
    one_sample_per_example: Flipout only: each example sees one weight sample
      at all its positions (see ``DenseGeneralFlipout``).
    noise_dtype: the projections' ``noise_dtype`` (None: float32; see ``Dense``).
    num_weight_groups: grouped reparameterization only: the projections' weight
      samples per call, one per equal group of the batch (see ``Dense``).
  """

  num_heads: int
  dtype: Any = None
  param_dtype: Any = jnp.float32
  qkv_features: int | None = None
  out_features: int | None = None
  broadcast_dropout: bool = True
  dropout_rate: float = 0.0
  deterministic: bool | None = None
  precision: Any = None
  kernel_init: Initializer = nn.initializers.lecun_normal()
  out_kernel_init: Initializer | None = None
  bias_init: Initializer = nn.initializers.zeros_init()
  out_bias_init: Initializer | None = None
  use_bias: bool = True
  attention_fn: Callable[..., Array] = nn.dot_product_attention
  decode: bool = False
  normalize_qk: bool = False
  force_fp32_for_softmax: bool = False
  qkv_kernel_axes: Axes = ("embed", "heads", "kv")
  out_kernel_axes: Axes = ("heads", "kv", "embed")
  activation_axes: Axes = None
  kernel_stddev_init: Initializer = fan_in_stddev(0.1)
  bias_stddev_init: Initializer = constant_stddev(0.01)
  bayesian_bias: bool = False
  prior: Prior = NormalPrior()
  one_sample_per_example: bool = False
  noise_dtype: Any = None
  num_weight_groups: int = 1

  estimator: ClassVar[str]

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_k: Array | None = None,
               inputs_v: Array | None = None, *, mask: Array | None = None,
               bias: Array | None = None, deterministic: bool | None = None,
               dropout_rng: Array | None = None, sow_weights: bool = False) -> Array:
    """Attends from ``inputs_q`` to ``inputs_k`` (default ``inputs_q``) and ``inputs_v``.

    Args:
      inputs_q: queries ``(batch..., q_length, features)``.
      inputs_k: keys ``(batch..., kv_length, features)`` (default ``inputs_q``).
      inputs_v: values, shaped like the keys (default ``inputs_k``).
      mask: boolean, broadcastable to ``(batch..., heads, q_length,
        kv_length)``; False masks a weight out.
      bias: added to the attention logits, broadcastable like ``mask``.
      deterministic: posterior mean and no dropout; overrides the attribute.
      dropout_rng: key of the attention dropout (default: the ``'dropout'`` rng).
      sow_weights: sow the attention weights into ``'intermediates'``.

    Returns:
      ``(batch..., q_length, out_features)``.
    """
    owner = f"{type(self).__name__} {self.name!r}"
    if inputs_k is None:
      if inputs_v is not None:
        raise ValueError(f"{owner}: inputs_v given without inputs_k; pass the same array "
                         "as inputs_k and leave inputs_v None")
      inputs_k = inputs_q
    if inputs_v is None:
      inputs_v = inputs_k
    features = self.out_features or inputs_q.shape[-1]
    qkv_features = self.qkv_features or inputs_q.shape[-1]
    if qkv_features % self.num_heads:
      raise ValueError(f"{owner}: qkv_features={qkv_features} is not a multiple of "
                       f"num_heads={self.num_heads}")
    head_dim = qkv_features // self.num_heads
    if deterministic is None:
      deterministic = self.deterministic

    # The Dense classes' shared attributes; the deterministic twin ignores the posterior ones.
    dense = functools.partial(
        dense_general_class(self.estimator), dtype=self.dtype, param_dtype=self.param_dtype,
        precision=self.precision, use_bias=self.use_bias,
        kernel_stddev_init=self.kernel_stddev_init, bias_stddev_init=self.bias_stddev_init,
        bayesian_bias=self.bayesian_bias, prior=self.prior,
        one_sample_per_example=self.one_sample_per_example, noise_dtype=self.noise_dtype,
        num_weight_groups=self.num_weight_groups)
    qkv_axes = self.qkv_kernel_axes
    projection = functools.partial(
        dense, features=(self.num_heads, head_dim), axis=-1, kernel_init=self.kernel_init,
        bias_init=self.bias_init, kernel_axes=qkv_axes,
        bias_axes=qkv_axes and tuple(qkv_axes)[-2:])
    heads = lambda name, x: self._constrain(projection(name=name)(x, deterministic))
    query, key, value = heads("query", inputs_q), heads("key", inputs_k), heads("value", inputs_v)

    if self.normalize_qk:  # ViT-22B (arxiv.org/abs/2302.05442): stabler at high learning rates
      scale_init = nn.initializers.ones_init()
      if qkv_axes is not None:
        scale_init = nn.with_logical_partitioning(scale_init, tuple(qkv_axes)[-1:])
      norm = functools.partial(nn.LayerNorm, use_bias=False, dtype=self.dtype,
                               param_dtype=self.param_dtype, scale_init=scale_init)
      query, key = norm(name="query_ln")(query), norm(name="key_ln")(key)

    if self.decode:
      key, value, mask = self._cached(query, key, value, mask)

    dropout = self.dropout_rate > 0.0 and not deterministic
    if dropout and dropout_rng is None:
      dropout_rng = self.make_rng("dropout")
    kwargs = dict(bias=bias, mask=mask, dropout_rng=dropout_rng, dropout_rate=self.dropout_rate,
                  broadcast_dropout=self.broadcast_dropout, deterministic=not dropout,
                  dtype=self.dtype, precision=self.precision,
                  force_fp32_for_softmax=self.force_fp32_for_softmax)
    accepted = inspect.signature(self.attention_fn).parameters
    if bias is not None and "bias" not in accepted:
      raise ValueError(f"{owner}: a logits bias was given but attention_fn="
                       f"{getattr(self.attention_fn, '__name__', self.attention_fn)} "
                       "takes no `bias` argument")
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    if sow_weights:
      kwargs["module"] = self
    attended = self.attention_fn(query, key, value, **kwargs)

    out_axes = self.out_kernel_axes
    out = dense(features=features, axis=(-2, -1),
                kernel_init=self.out_kernel_init or self.kernel_init,
                bias_init=self.out_bias_init or self.bias_init,
                kernel_axes=out_axes, bias_axes=out_axes and tuple(out_axes)[-1:], name="out")
    return out(attended, deterministic)

  def _constrain(self, x: Array) -> Array:
    if self.activation_axes is None:
      return x
    return nn.with_logical_constraint(x, tuple(self.activation_axes))

  def _cached(self, query: Array, key: Array, value: Array, mask: Array | None
              ) -> tuple[Array, Array, Array | None]:
    """Writes this step's key and value into the cache; returns all of them and a mask.

    The first call (``init``) only creates a cache shaped like its full-length
    keys and values and attends as without one.
    """
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not initialized:
      return key, value, mask
    *batch, max_length, num_heads, head_dim = cached_key.value.shape
    if query.shape != (*batch, 1, num_heads, head_dim):
      raise ValueError(f"{type(self).__name__} {self.name!r}: decoding takes one position at "
                       f"a time, queries of shape {(*batch, 1, num_heads, head_dim)}, not "
                       f"{query.shape}")
    position = index.value
    start = (0,) * len(batch) + (position, 0, 0)
    cached_key.value = lax.dynamic_update_slice(cached_key.value, key, start)
    cached_value.value = lax.dynamic_update_slice(cached_value.value, value, start)
    index.value = position + 1
    # The query at `position` sees the cache up to and including itself, not the zeros after.
    visible = jnp.broadcast_to(jnp.arange(max_length) <= position, (*batch, 1, 1, max_length))
    return (cached_key.value, cached_value.value,
            visible if mask is None else jnp.logical_and(mask, visible))


class MultiHeadDotProductAttention(_Attention):
  """``nn.MultiHeadDotProductAttention`` with T5X-style axes: the deterministic twin.

  Computes what flax's layer computes, with the same parameters; takes the
  posterior attributes of its Bayesian siblings and ignores them.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers.attention import MultiHeadDotProductAttention
    >>> layer = MultiHeadDotProductAttention(num_heads=2, qkv_features=8)
    >>> x = jnp.ones((1, 5, 6))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> nn.get_partition_spec(variables)['params']['query']['kernel']
    P('embed', 'heads', 'kv')
    >>> layer.apply(variables, x).shape
    (1, 5, 6)

  Attributes are those of ``_Attention``.
  """

  estimator = "deterministic"


class MultiHeadDotProductAttentionReparameterization(_Attention):
  """Multi-head attention whose projections draw one weight sample per call.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> import flax.linen as nn
    >>> from meshbayes.layers.attention import MultiHeadDotProductAttentionReparameterization
    >>> layer = MultiHeadDotProductAttentionReparameterization(num_heads=2, use_bias=False)
    >>> x = jnp.ones((1, 5, 6))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> jax.tree_util.tree_map(jnp.shape, nn.unbox(variables['params']['out']))
    {'kernel_loc': (2, 3, 6), 'kernel_scale': (2, 3, 6)}

  Attributes are those of ``_Attention``.
  """

  estimator = "reparameterization"


class MultiHeadDotProductAttentionFlipout(_Attention):
  """Multi-head attention with Flipout projections: the Bayesian Transformer's.

  Example (causal self-attention with a logits bias, KL recorded)::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import total_kl
    >>> from meshbayes.layers.attention import MultiHeadDotProductAttentionFlipout
    >>> layer = MultiHeadDotProductAttentionFlipout(num_heads=2, qkv_features=8)
    >>> x = jnp.ones((1, 5, 6))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> y, state = layer.apply(variables, x, mask=nn.make_causal_mask(jnp.ones((1, 5))),
    ...                        bias=jnp.zeros((1, 2, 5, 5)), rngs={'sample': jax.random.key(1)},
    ...                        mutable=['losses'])
    >>> y.shape, sorted(state['losses']), bool(total_kl(state) > 0)
    ((1, 5, 6), ['key', 'out', 'query', 'value'], True)

  Attributes are those of ``_Attention``.
  """

  estimator = "flipout"


class MultiHeadDotProductAttentionLocalReparameterization(_Attention):
  """Multi-head attention with locally reparameterized projections.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers.attention import (
    ...     MultiHeadDotProductAttentionLocalReparameterization)
    >>> layer = MultiHeadDotProductAttentionLocalReparameterization(num_heads=2)
    >>> q, kv = jnp.ones((1, 5, 6)), jnp.ones((1, 7, 6))
    >>> variables = layer.init(jax.random.key(0), q, kv)
    >>> layer.apply(variables, q, kv, rngs={'sample': jax.random.key(1)}).shape
    (1, 5, 6)

  Attributes are those of ``_Attention``.
  """

  estimator = "local_reparameterization"


class MultiHeadDotProductAttentionGroupedReparameterization(_Attention):
  """Multi-head attention whose projections draw one weight sample per batch group.

  Example (two groups of one example each)::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers.attention import (
    ...     MultiHeadDotProductAttentionGroupedReparameterization)
    >>> layer = MultiHeadDotProductAttentionGroupedReparameterization(num_heads=2,
    ...                                                               num_weight_groups=2)
    >>> x = jnp.ones((2, 5, 6))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> y = layer.apply(variables, x, rngs={'sample': jax.random.key(1)})
    >>> y.shape, bool(jnp.any(y[0] != y[1]))
    ((2, 5, 6), True)

  Attributes are those of ``_Attention``.
  """

  estimator = "grouped_reparameterization"


_ATTENTION = dict(zip(DENSE_ESTIMATORS, (
    MultiHeadDotProductAttention, MultiHeadDotProductAttentionReparameterization,
    MultiHeadDotProductAttentionFlipout, MultiHeadDotProductAttentionLocalReparameterization,
    MultiHeadDotProductAttentionGroupedReparameterization)))


def attention_class(estimator: str) -> type[_Attention]:
  """The attention class of an estimator name (``'deterministic'``, ``'flipout'``, ...).

  >>> attention_class('flipout').__name__
  'MultiHeadDotProductAttentionFlipout'
  """
  if estimator not in _ATTENTION:
    raise ValueError(f"attention_class: estimator={estimator!r} is not one of "
                     f"{', '.join(_ATTENTION)}")
  return _ATTENTION[estimator]
