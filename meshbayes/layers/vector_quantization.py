"""Vector quantization (van den Oord et al., 2017): VQ-VAE's bottleneck.

``VectorQuantizer`` replaces each vector of the last axis by its nearest
codebook entry, gradient straight through; it records the codebook and
commitment losses (means over all elements) in ``VQ_LOSS_COLLECTION``, the KL's
collection, for ``total_vq_loss`` (``total_kl`` ignores them), and sows the codes
into ``'intermediates'``. ``quantize`` and ``code_usage`` are the pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from meshbayes.layers.kl import KL_COLLECTION
from meshbayes.layers.variational import boxed_init, partitioning_box

Array = jax.Array
Initializer = Any
Axes = tuple[str | None, str | None]

VQ_LOSS_COLLECTION = KL_COLLECTION
VQ_LOSS_NAMES = ("vq_codebook", "vq_commitment")
VQ_STATS_COLLECTION = "vq_stats"
CODES_NAME = "codes"


def quantize(x: Array, codebook: Array) -> tuple[Array, Array]:
  """The nearest codebook entry of each vector of ``x`` (squared Euclidean distance).

  Args:
    x: ``(..., d)`` vectors.
    codebook: ``(k, d)`` entries.

  Returns:
    ``(q, indices)``: ``q[..., :] = codebook[indices]`` (``x``'s shape, the
    codebook's dtype) and the ``int32`` indices (``x``'s shape without its
    last axis); ties go to the lowest index.

  >>> codebook = jnp.array([[0., 0.], [1., 1.], [-2., 0.]])
  >>> q, i = quantize(jnp.array([[0.9, 0.8], [-1.2, 0.1]]), codebook)
  >>> i.tolist(), q.tolist()
  ([1, 2], [[1.0, 1.0], [-2.0, 0.0]])
  """
  flat = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  entries = codebook.astype(jnp.float32)
  # |x|^2 - 2 x.e + |e|^2: one matmul, not a (n, k, d) difference tensor.
  distances = (jnp.sum(flat * flat, axis=1, keepdims=True) - 2.0 * flat @ entries.T
               + jnp.sum(entries * entries, axis=1)[None, :])
  indices = jnp.argmin(distances, axis=1).astype(jnp.int32).reshape(x.shape[:-1])
  return jnp.take(codebook, indices, axis=0), indices


def code_usage(indices: Array, num_embeddings: int) -> tuple[Array, Array]:
  """How often each entry is used, and the perplexity ``exp(entropy)`` of that usage.

  The perplexity is the effective number of entries used: ``num_embeddings``
  when all are used equally, 1 when a single one is.

  >>> counts, perplexity = code_usage(jnp.array([0, 0, 1, 1]), num_embeddings=4)
  >>> counts.tolist(), round(float(perplexity), 4)
  ([2, 2, 0, 0], 2.0)
  """
  counts = jnp.bincount(jnp.ravel(indices), length=num_embeddings)
  p = counts / jnp.maximum(jnp.sum(counts), 1)
  entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
  return counts, jnp.exp(entropy)


def total_vq_loss(state: Mapping[str, Any]) -> Array:
  """The sum of every vector quantizer's recorded codebook and commitment losses.

  Args:
    state: the mutated collections of ``apply(..., mutable=[VQ_LOSS_COLLECTION])``.

  Returns:
    A float32 scalar; 0 when nothing was recorded.
  """
  collection = state.get(VQ_LOSS_COLLECTION, {})
  values = [jnp.sum(jnp.asarray(v, jnp.float32))
            for path, v in traverse_util.flatten_dict(collection).items()
            if path[-1] in VQ_LOSS_NAMES]
  return sum(values, jnp.zeros((), jnp.float32))


class VectorQuantizer(nn.Module):
  """Vector quantization with a straight-through gradient (VQ-VAE's bottleneck).

  Each vector along the last axis of the input becomes its nearest codebook
  entry ``q``; the output is ``x + sg(q - x)``: ``q`` forward (exactly), the
  identity backward. The embedding dimension is the input's last dimension
  (distances and losses in float32). The
  codebook is trained either by gradient, through the recorded codebook loss
  (``ema=False``: the parameter ``params/codebook``), or by exponential moving
  averages (``ema=True``, the paper's Appendix A.1; the update is in
  docs/layers.md): the variables ``vq_stats/{codebook, cluster_size,
  embed_sum}``, updated when that collection is mutable and ``deterministic``
  is False.

  Example:

  >>> vq = VectorQuantizer(num_embeddings=4)
  >>> x = jnp.linspace(-1.0, 1.0, 12).reshape(2, 3, 2)
  >>> variables = vq.init(jax.random.key(0), x)
  >>> y, state = vq.apply(variables, x, mutable=[VQ_LOSS_COLLECTION, 'intermediates'])
  >>> codebook = nn.unbox(variables)['params']['codebook']
  >>> codes = state['intermediates']['codes'][0]
  >>> bool((y == codebook[codes]).all()), codes.shape, sorted(state['losses'])
  (True, (2, 3), ['vq_codebook', 'vq_commitment'])

  Attributes:
    num_embeddings: codebook size ``k``.
    commitment_cost: ``beta``, the commitment loss's weight (0.25, the paper's).
    ema: train the codebook by exponential moving averages instead of by gradient.
    decay: the moving averages' ``gamma`` (``ema=True``).
    epsilon: Laplace smoothing of the cluster sizes (``ema=True``).
    deterministic: no EMA update (also a call argument); the quantization
      itself is deterministic either way.
    codebook_init: initializer of the ``(k, d)`` codebook (uniform with
      variance ``1 / d``); a boxed one (``nn.with_logical_partitioning``)
      gives the axes instead, with ``codebook_axes=None``.
    codebook_axes: logical axes of the codebook (entries, embedding), T5X
      style; the EMA ``embed_sum`` shares them and ``cluster_size`` takes the
      first.
    dtype: dtype of the output (the input's when None).
    param_dtype: dtype of the codebook and statistics.
  """

  num_embeddings: int
  commitment_cost: float = 0.25
  ema: bool = False
  decay: float = 0.99
  epsilon: float = 1e-5
  deterministic: bool = False
  codebook_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "uniform")
  codebook_axes: Axes | None = ("vocab", "embed")
  dtype: Any | None = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, deterministic: bool | None = None) -> Array:
    """Quantizes ``x`` (``(..., d)``), records the losses and codes, updates EMA statistics.

    Args:
      x: the encoder's output; its last axis is the embedding.
      deterministic: overrides the attribute; True skips the EMA update.

    Returns:
      ``x + sg(q - x)``: the nearest entries, with the identity's gradient.
    """
    deterministic = self.deterministic if deterministic is None else deterministic
    shape = (self.num_embeddings, x.shape[-1])
    box = partitioning_box(self, "codebook", self.codebook_init, shape, self.param_dtype,
                           self.codebook_axes)
    init = boxed_init(box, self.codebook_init)
    if self.ema:
      codebook_var = self.variable(VQ_STATS_COLLECTION, "codebook",
                                   lambda: init(self.make_rng("params"), shape, self.param_dtype))
      codebook = codebook_var.value
      # The statistics start consistent with the codebook: e_i = m_i / N_i.
      cluster_size = self.variable(VQ_STATS_COLLECTION, "cluster_size", lambda: _rebox(
          box, jnp.ones((shape[0],), self.param_dtype), first_axis_only=True))
      embed_sum = self.variable(VQ_STATS_COLLECTION, "embed_sum",
                                lambda: _rebox(box, codebook))
    else:
      codebook = self.param("codebook", init, shape, self.param_dtype)

    q, indices = quantize(x, codebook)
    self.sow("intermediates", CODES_NAME, indices)
    xf, qf = x.astype(jnp.float32), q.astype(jnp.float32)
    if self.is_mutable_collection(VQ_LOSS_COLLECTION) and not self.is_initializing():
      commitment = self.commitment_cost * jnp.mean(jnp.square(xf - jax.lax.stop_gradient(qf)))
      _record(self, "vq_commitment", commitment)
      if not self.ema:
        _record(self, "vq_codebook", jnp.mean(jnp.square(jax.lax.stop_gradient(xf) - qf)))

    if (self.ema and not deterministic and not self.is_initializing()
        and self.is_mutable_collection(VQ_STATS_COLLECTION)):
      new = ema_update(jax.lax.stop_gradient(xf), indices, cluster_size.value,
                       embed_sum.value, self.decay, self.epsilon)
      cluster_size.value, embed_sum.value, codebook_var.value = (
          v.astype(self.param_dtype) for v in new)

    dtype = self.dtype or x.dtype
    # Straight-through, x + sg(q - x) rearranged so the forward value is q bit for bit:
    # sg(q) + (x - sg(x)) is q + 0 forward and the identity backward. No gradient reaches
    # the codebook through the output; it gets one from the codebook loss only.
    return (jax.lax.stop_gradient(qf) + (xf - jax.lax.stop_gradient(xf))).astype(dtype)


def ema_update(x: Array, indices: Array, cluster_size: Array, embed_sum: Array, decay: float,
               epsilon: float) -> tuple[Array, Array, Array]:
  """One EMA step of the codebook (``VectorQuantizer``'s formulas, the paper's Appendix A.1).

  Args:
    x: ``(..., d)`` vectors, ``indices`` their entries (``x.shape[:-1]``).
    cluster_size: ``(k,)`` moving counts ``N``; ``embed_sum`` ``(k, d)`` moving sums ``m``.
    decay: ``gamma``; ``epsilon``: Laplace smoothing.

  Returns:
    The new ``(cluster_size, embed_sum, codebook)``, in float32.
  """
  k = cluster_size.shape[0]
  onehot = jax.nn.one_hot(jnp.ravel(indices), k, dtype=jnp.float32)
  flat = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  n = decay * cluster_size.astype(jnp.float32) + (1 - decay) * jnp.sum(onehot, axis=0)
  m = decay * embed_sum.astype(jnp.float32) + (1 - decay) * onehot.T @ flat
  total = jnp.sum(n)
  smoothed = (n + epsilon) / (total + k * epsilon) * total
  return n, m, m / smoothed[:, None]


def _rebox(box: Any, value: Array, first_axis_only: bool = False) -> Any:
  """``value`` in the codebook's partitioning box (its first axis only for per-entry values)."""
  if box is None:
    return value
  if first_axis_only:
    return box.replace(value=value, names=tuple(box.names)[:1])
  return box.replace_boxed(value)


def _record(module: nn.Module, name: str, value: Array) -> None:
  # Summed over the calls of one apply: each call's vectors belong to the objective.
  module.sow(VQ_LOSS_COLLECTION, name, value, init_fn=lambda: jnp.zeros((), jnp.float32),
             reduce_fn=lambda total, new: total + new)
