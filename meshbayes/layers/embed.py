"""A Bayesian drop-in for ``nn.Embed``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import flax.linen as nn

from meshbayes.layers.initializers import fan_in_stddev
from meshbayes.layers.priors import NormalPrior, Prior
from meshbayes.layers.variational import (Axes, Initializer, constrain_like, partitioning_box,
                                          record_kl, use_posterior_mean, variational_param)

Array = jax.Array


class EmbedReparameterization(nn.Module):
  """``nn.Embed`` with a normal posterior over the table, one table sample per call.

  ``__call__`` looks rows up and ``attend`` computes ``query @ table.T`` (tied
  output logits), as ``nn.Embed`` does; each call draws its own table sample.

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

  Attributes:
    num_embeddings: vocabulary size.
    features: embedding width.
    dtype: dtype of the returned vectors (default: the parameters').
    param_dtype: parameter dtype.
    embedding_init: initializer of the table's posterior mean (``nn.Embed``'s
      default; may be boxed with ``nn.with_logical_partitioning``).
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

  def setup(self):
    if self.num_embeddings < 1 or self.features < 1:
      raise ValueError(f"EmbedReparameterization {self.name!r}: num_embeddings="
                       f"{self.num_embeddings!r} and features={self.features!r} must be >= 1")
    shape = (self.num_embeddings, self.features)
    self.box = partitioning_box(self, "embedding", self.embedding_init, shape,
                                self.param_dtype, self.embedding_axes)
    self.embedding = variational_param(self, "embedding", shape, self.embedding_init,
                                       self.embedding_stddev_init, self.box, self.param_dtype)

  def _table(self, deterministic: bool | None) -> Array:
    record_kl(self, [("embedding", self.prior, self.embedding)])
    table = self.embedding.loc
    if not use_posterior_mean(self, deterministic):
      table = self.embedding.sample(self.make_rng("sample"), constrain_like(self.box))
    return table.astype(self.dtype or self.param_dtype)

  def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
    """Looks up the rows of a table sample (or of the posterior mean).

    Args:
      inputs: integer ids, any shape.
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      ``inputs.shape + (features,)`` embeddings.
    """
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError(f"EmbedReparameterization {self.name!r}: inputs must be integer ids, "
                       f"got dtype {inputs.dtype}")
    return jnp.take(self._table(deterministic), inputs, axis=0)

  def attend(self, query: Array, deterministic: bool | None = None) -> Array:
    """Inner products of ``query`` with every row of a table sample.

    Args:
      query: array whose last dimension is ``features``.
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      ``query.shape[:-1] + (num_embeddings,)`` logits.
    """
    table = self._table(deterministic)
    return jnp.dot(query.astype(table.dtype), table.T)
