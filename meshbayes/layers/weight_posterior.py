"""Posteriors held outside the layers: IVON's diagonal Gaussian, a deep ensemble, MC dropout.

A model trained by variational learning (``meshbayes.training.ivon``) keeps its
posterior beside its parameters; ``WeightPosterior``, ``Ensemble`` and
``MCDropout`` each implement ``posteriors.Posterior``, so evaluation takes them
in place of ``params`` and every predictive runs unchanged.
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from meshbayes.field_checks import positive_int
from meshbayes.layers.estimators import standard_normal

Array = jax.Array


def path_key(key: Array, path: tuple[Any, ...]) -> Array:
  """``key`` folded with a leaf's tree path (crc32, not ``hash``: Python salts string hashes)."""
  return jax.random.fold_in(key, zlib.crc32(jax.tree_util.keystr(path).encode()) & 0x7FFFFFFF)


def scaled_normal(key: Array, stddev: Any) -> Any:
  """``stddev * N(0, 1)`` in float32, each leaf with its own key folded from its path.

  Inside ``jit`` a sharded leaf is drawn shard by shard on its devices, with
  the same values on any mesh (jax's partitionable threefry).
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, s: s * standard_normal(path_key(key, path), s.shape), stddev)


def perturb(params: Any, noise: Any) -> Any:
  """``params + noise``, added in float32 and cast back to each parameter's dtype."""
  return jax.tree.map(lambda p, n: (p.astype(jnp.float32) + n).astype(p.dtype), params, noise)


# Members drawn from keys, applied with their weights alone: these ``Posterior`` methods are
# the same for every such kind, which takes them as class attributes.


def drawn_member_keys(self: Any, rng: Array | None, num_samples: int) -> Array:
  """``num_samples`` keys from ``rng`` (``Posterior.member_keys``); an rng is needed."""
  del self
  if rng is None:
    raise ValueError(f"num_samples={num_samples} posterior samples need an rng")
  return jax.random.split(rng, num_samples)


def drawn_num_members(self: Any, num_samples: int) -> int:
  """As many members as samples (``Posterior.num_members``)."""
  del self
  return num_samples


def weights_only(self: Any, key: Array) -> dict[str, Any]:
  """No ``apply`` keywords besides the weights (``Posterior.apply_options``)."""
  del self, key
  return {}


class WeightPosterior(NamedTuple):
  """``N(mean, stddev^2)`` per weight; a weight sample is ``mean + stddev * eps``.

  A pytree: ``jit`` takes it as ``params`` are taken, shardings included.

  >>> posterior = WeightPosterior(mean={'w': jnp.zeros(3)}, stddev={'w': jnp.full(3, 1e-9)})
  >>> bool(jnp.allclose(posterior.sample(jax.random.key(0))['w'], 0.0, atol=1e-6))
  True
  """

  mean: Any
  stddev: Any

  external = True
  has_mean = True

  def sample(self, key: Array) -> Any:
    """One weight sample, in the parameters' dtypes (leaf noise keyed by its tree path)."""
    return perturb(self.mean, scaled_normal(key, self.stddev))

  def samples(self, key: Array, num_samples: int) -> Any:
    """``num_samples`` weight samples stacked on a leading axis (that many copies in memory:
    for a large model, call ``sample`` per key)."""
    positive_int("WeightPosterior.samples", "num_samples", num_samples)
    return jax.lax.map(self.sample, jax.random.split(key, num_samples))

  def mean_weights(self) -> Any:
    return self.mean

  member_keys = drawn_member_keys
  num_members = drawn_num_members
  apply_options = weights_only

  def sampled_axes(self) -> Any:
    return jax.tree.map(lambda _: 0, self.mean)

  def stacked(self, keys: Array) -> Any:
    return jax.vmap(self.sample)(keys)


class Ensemble(NamedTuple):
  """A deep ensemble (Lakshminarayanan et al., 2017): ``K`` independently trained
  models' parameters stacked on a leading axis, a uniform mixture.

  It takes the place of ``params`` as a ``WeightPosterior`` does; its "samples"
  are its members, each exactly once: ``sample(i)`` is member ``i``, and
  model averaging over an ensemble averages its ``K`` members. It has no
  posterior mean (``has_mean``): its first member stands in where only shapes matter.
  """

  members: Any

  external = True
  has_mean = False

  @property
  def size(self) -> int:
    return jax.tree.leaves(self.members)[0].shape[0]

  def sample(self, index: Array) -> Any:
    """Member ``index`` (an integer, traced or not)."""
    return jax.tree.map(lambda x: x[index], self.members)

  @classmethod
  def stack(cls, members: list[Any]) -> Ensemble:
    """The ensemble of parameter trees of one model (one per member)."""
    return cls(jax.tree.map(lambda *xs: jnp.stack(xs), *members))

  def mean_weights(self) -> Any:
    return self.sample(0)

  def member_keys(self, rng: Array | None, num_samples: int) -> Array:
    del rng, num_samples  # every member, once
    return jnp.arange(self.size)

  def num_members(self, num_samples: int) -> int:
    del num_samples
    return self.size

  apply_options = weights_only

  def sampled_axes(self) -> Any:
    return jax.tree.map(lambda _: 0, self.mean_weights())

  def stacked(self, keys: Array) -> Any:
    if keys.shape[0] == self.size:  # all members in order (member_keys): already stacked
      return self.members
    return jax.vmap(self.sample)(keys)


class MCDropout(NamedTuple):
  """A deterministic model's parameters, predicted with Monte Carlo dropout (Gal and
  Ghahramani, 2016): each "sample" is a dropout rng, the weights stay ``params``.

  It takes the place of ``params`` as a ``WeightPosterior`` does; a model that
  supports it applies its dropout with the sample's key (``apply_options``).
  """

  params: Any

  external = True
  has_mean = True

  def sample(self, key: Array) -> Any:
    del key  # the weights do not change; the key goes to the dropout layers
    return self.params

  def mean_weights(self) -> Any:
    return self.params

  member_keys = drawn_member_keys
  num_members = drawn_num_members

  def apply_options(self, key: Array) -> dict[str, Any]:
    return {"enable_dropout": True, "rngs": {"dropout": key}}

  def sampled_axes(self) -> Any:
    return jax.tree.map(lambda _: None, self.params)  # no weight is drawn

  def stacked(self, keys: Array) -> Any:
    del keys
    return self.params
