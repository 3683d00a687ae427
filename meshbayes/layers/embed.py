"""Bayesian drop-ins for ``nn.Embed``, one class per estimator, and the deterministic twin.

``__call__`` looks rows up and ``attend`` computes tied logits, as ``nn.Embed``;
the table becomes ``embedding_loc`` and ``embedding_scale``.
``embed_class(estimator)`` picks the class by name.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from meshbayes.layers import estimators
from meshbayes.layers.initializers import fan_in_stddev
from meshbayes.layers.priors import NormalPrior, Prior
from meshbayes.layers.variational import (
  Axes,
  Initializer,
  boxed_init,
  constrain_like,
  partitioning_box,
  record_kl,
  use_posterior_mean,
  variational_param,
)

Array = jax.Array


def _attend_contract(query: Array, table: Array, *, preferred_element_type: Any = None) -> Array:
  """``query @ table.T`` over the feature axis."""
  dims = (((query.ndim - 1,), (1,)), ((), ()))
  return lax.dot_general(query, table, dims, preferred_element_type=preferred_element_type)


class _Embed(nn.Module):
  """The shared body of the Embed layers; subclasses pick the estimator.

  Attributes:
    num_embeddings: vocabulary size.
    features: embedding width.
    dtype: dtype of the returned vectors and logits (default: the parameters').
    param_dtype: parameter dtype.
    embedding_init: initializer of the table (its posterior mean); may be
      boxed with ``nn.with_logical_partitioning``.
    embedding_axes: logical axis names of the table, e.g. ``('vocab', 'embed')``.
    embedding_stddev_init: initializer of the posterior standard deviation
      (default ``0.1 / sqrt(features)``, a tenth of the mean's init scale).
    prior: prior of the table (default N(0, 1)).
    deterministic: use the posterior mean; the call argument overrides it.
  """

  num_embeddings: int
  features: int
  dtype: Any = None
  param_dtype: Any = jnp.float32
  embedding_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "normal",
                                                                  out_axis=0)
  embedding_axes: Axes = None
  embedding_stddev_init: Initializer = fan_in_stddev(0.1, in_axis=-1)
  prior: Prior = NormalPrior()
  deterministic: bool | None = None

  estimator: ClassVar[str | None]

  def setup(self):
    if self.num_embeddings < 1 or self.features < 1:
      raise ValueError(f"{type(self).__name__} {self.name!r}: num_embeddings="
                       f"{self.num_embeddings!r} and features={self.features!r} must be >= 1")
    shape = (self.num_embeddings, self.features)
    self.box = partitioning_box(self, "embedding", self.embedding_init, shape,
                                self.param_dtype, self.embedding_axes)
    if self.estimator is None:
      self.table = estimators.Normal(
          self.param("embedding", boxed_init(self.box, self.embedding_init), shape,
                     self.param_dtype), None)
    else:
      self.table = variational_param(self, "embedding", shape, self.embedding_init,
                                     self.embedding_stddev_init, self.box, self.param_dtype)

  def _sample_key(self, deterministic: bool | None) -> Array | None:
    """Records the KL and returns the ``'sample'`` key, or None for the mean."""
    if self.estimator is None:
      return None
    record_kl(self, [("embedding", self.prior.for_fan_in(self.features), self.table)])
    return None if use_posterior_mean(self, deterministic) else self.make_rng("sample")

  def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
    """Looks up the embeddings of integer ids.

    Args:
      inputs: integer ids, any shape.
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      ``inputs.shape + (features,)`` embeddings.
    """
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError(f"{type(self).__name__} {self.name!r}: inputs must be integer ids, "
                       f"got dtype {inputs.dtype}")
    key = self._sample_key(deterministic)
    if key is None:
      rows = estimators.lookup_posterior_mean(inputs, self.table)
    else:
      rows = estimators.LOOKUP[self.estimator](key, inputs, self.table, constrain_like(self.box))
    return rows.astype(self.dtype or self.param_dtype)

  def attend(self, query: Array, deterministic: bool | None = None) -> Array:
    """Inner products of ``query`` with every row: tied output logits.

    Args:
      query: array whose last dimension is ``features``.
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      ``query.shape[:-1] + (num_embeddings,)`` logits.
    """
    key = self._sample_key(deterministic)
    query = query.astype(self.dtype or jnp.result_type(query, self.param_dtype))
    if key is None:
      return estimators.posterior_mean(_attend_contract, query, self.table)
    return estimators.DENSE[self.estimator](key, _attend_contract, query, self.table, None,
                                            constrain_like(self.box))


class Embed(_Embed):
  """``nn.Embed`` with T5X-style ``embedding_axes``: the deterministic twin.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import Embed
    >>> embed = Embed(num_embeddings=10, features=4, embedding_axes=('vocab', 'embed'))
    >>> variables = embed.init(jax.random.key(0), jnp.array([[1, 2]]))
    >>> nn.get_partition_spec(variables)['params']['embedding']
    P('vocab', 'embed')
  """

  estimator = None


class EmbedReparameterization(_Embed):
  """``nn.Embed`` with a normal posterior over the table, one table sample per call.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import EmbedReparameterization
    >>> embed = EmbedReparameterization(num_embeddings=10, features=4,
    ...                                 embedding_axes=('vocab', 'embed'))
    >>> ids = jnp.array([[1, 2, 3]])
    >>> variables = embed.init(jax.random.key(0), ids)
    >>> nn.get_partition_spec(variables)['params']['embedding_loc']
    P('vocab', 'embed')
    >>> embed.apply(variables, ids, rngs={'sample': jax.random.key(1)}).shape
    (1, 3, 4)

  Attributes are those of ``_Embed``.
  """

  estimator = "reparameterization"


class EmbedFlipout(_Embed):
  """``nn.Embed`` with a normal posterior over the table and the Flipout estimator.

  One noise table per call, sign-flipped per token and feature.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import EmbedFlipout
    >>> embed = EmbedFlipout(num_embeddings=10, features=4)
    >>> variables = embed.init(jax.random.key(0), jnp.array([1]))
    >>> embed.apply(variables, jnp.ones((2, 4)), method='attend',
    ...             rngs={'sample': jax.random.key(1)}).shape
    (2, 10)

  Attributes are those of ``_Embed``.
  """

  estimator = "flipout"


class EmbedLocalReparameterization(_Embed):
  """``nn.Embed`` with a normal posterior over the table, sampled per token.

  Attributes are those of ``_Embed``.
  """

  estimator = "local_reparameterization"


_EMBED = {"deterministic": Embed, "reparameterization": EmbedReparameterization,
          "flipout": EmbedFlipout, "local_reparameterization": EmbedLocalReparameterization}


def embed_class(estimator: str) -> type[_Embed]:
  """The Embed class of an estimator name (``'deterministic'``, ``'flipout'``, ...).

  >>> embed_class('deterministic').__name__
  'Embed'
  """
  if estimator not in _EMBED:
    raise ValueError(f"embed_class: estimator={estimator!r} is not one of {', '.join(_EMBED)}")
  return _EMBED[estimator]
