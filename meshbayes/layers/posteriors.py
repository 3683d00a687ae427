"""One protocol for every posterior a predictive reads, and the registry of its kinds.

``Posterior`` names what a predictive needs: mean weights, one member's weights,
the keys of ``S`` members, a member's ``apply`` options and which leaves differ.
Kinds: ``LayerWeights`` (``params`` as trained), ``WeightPosterior``, ``Ensemble``,
``MCDropout``; a new kind is a class with these members and one ``register_kind``.
Where a run's posterior comes from (restored with the run:
``meshbayes.training.run_posteriors``; built from it by a predictive method:
``meshbayes.evaluation.methods``) and adding one: docs/posteriors.md.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, Protocol

import jax

from meshbayes.layers.variational import layer_sample_axes, sample_layer_weights
from meshbayes.layers.weight_posterior import (Ensemble, MCDropout, WeightPosterior,
                                               drawn_member_keys, drawn_num_members,
                                               weights_only)

Array = jax.Array


class Posterior(Protocol):
  """What a predictive needs from a posterior over a model's weights.

  Attributes:
    external: the posterior is held outside the model's layers (it has members
      even when the model's layers are deterministic).
    has_mean: it has a posterior mean to predict with (an ensemble has none).
  """

  external: ClassVar[bool]
  has_mean: ClassVar[bool]

  def mean_weights(self) -> Any:
    """The weights at the posterior mean (where only shapes matter, any member's)."""

  def sample(self, key: Array) -> Any:
    """One member's weights; the model applies them at its posterior mean."""

  def member_keys(self, rng: Array | None, num_samples: int) -> Array:
    """The keys of the members a model average runs over: ``num_samples`` of them from
    ``rng`` (None: a one-line ValueError), or every member of a finite posterior, once."""

  def num_members(self, num_samples: int) -> int:
    """How many members a model average of ``num_samples`` runs over."""

  def apply_options(self, key: Array) -> dict[str, Any]:
    """Keywords of ``module.apply`` for member ``key`` besides its weights."""

  def sampled_axes(self) -> Any:
    """``0`` for each leaf of ``sample``'s weights that differs between members, ``None``
    for each shared: the ``vmap`` axes that stack only what differs."""

  def stacked(self, keys: Array) -> Any:
    """The members' weights of ``keys``, stacked on the leaves of ``sampled_axes``."""


class LayerWeights(NamedTuple):
  """A model's ``params`` as trained: point weights, or Bayesian layers whose posterior
  lives in them (``w_loc``, ``w_scale``). Point weights are their own only member."""

  params: Any

  external = False
  has_mean = True

  def mean_weights(self) -> Any:
    return self.params

  def sample(self, key: Array) -> Any:
    return sample_layer_weights(self.params, key)

  member_keys = drawn_member_keys
  num_members = drawn_num_members
  apply_options = weights_only

  def sampled_axes(self) -> Any:
    return layer_sample_axes(self.params)

  def stacked(self, keys: Array) -> Any:
    return jax.vmap(self.sample, out_axes=self.sampled_axes())(keys)


_KINDS: list[type] = [LayerWeights]


def register_kind(kind: type) -> type:
  """Registers a class implementing ``Posterior`` (usable as a decorator)."""
  missing = [name for name in ("external", "has_mean", "mean_weights", "sample", "member_keys",
                               "num_members",
                               "apply_options", "sampled_axes", "stacked")
             if not hasattr(kind, name)]
  if missing:
    raise TypeError(f"register_kind: {kind.__name__} lacks {', '.join(missing)} of Posterior")
  if kind not in _KINDS:
    _KINDS.append(kind)
  return kind


for _kind in (WeightPosterior, Ensemble, MCDropout):
  register_kind(_kind)


def kinds() -> tuple[type, ...]:
  """The registered kinds of posterior."""
  return tuple(_KINDS)


def as_posterior(params: Any) -> Posterior:
  """``params`` as a ``Posterior``: a registered kind as it is, a parameter tree as
  ``LayerWeights``.

  >>> params = {'dense': {'kernel_loc': jax.numpy.zeros(2),
  ...                      'kernel_scale': jax.numpy.full(2, -30.0)}}
  >>> as_posterior(params).member_keys(jax.random.key(0), 3).shape
  (3,)
  >>> as_posterior(Ensemble.stack([params, params])).member_keys(jax.random.key(0), 3)
  Array([0, 1], dtype=int32)
  """
  return params if type(params) in _KINDS else LayerWeights(params)


def holds_posterior(params: Any) -> bool:
  """Whether ``params`` is a posterior held outside the layers (it has members)."""
  return as_posterior(params).external


def posterior_mean(params: Any) -> Any:
  """The weights at the posterior mean of ``params`` (any kind; an ``Ensemble``'s first
  member, where only shapes matter)."""
  return as_posterior(params).mean_weights()


def sample_weights(params: Any, key: Array) -> Any:
  """One member's weights of ``params`` (any kind): a sample of Bayesian layers' weights
  (``variational.sample_layer_weights``), a ``WeightPosterior``'s sample, an
  ``Ensemble``'s member ``key`` (an index), ``MCDropout``'s unchanged parameters.

  >>> params = {'dense': {'kernel_loc': jax.numpy.zeros(3),
  ...                      'kernel_scale': jax.numpy.full(3, -30.0)}}
  >>> sample = sample_weights(params, jax.random.key(0))
  >>> bool(jax.numpy.allclose(sample['dense']['kernel_loc'], 0.0, atol=1e-9))
  True
  """
  return as_posterior(params).sample(key)


def sample_axes(params: Any) -> Any:
  """``as_posterior(params).sampled_axes()``: which leaves differ between members.

  >>> sample_axes({'dense': {'kernel_loc': 0.0, 'kernel_scale': 0.0, 'bias': 0.0}})
  {'dense': {'bias': None, 'kernel_loc': 0, 'kernel_scale': None}}
  """
  return as_posterior(params).sampled_axes()


def dropout_rngs(params: Any, key: Array) -> dict[str, Any]:
  """``apply`` keywords for member ``key``: dropout on with ``key`` for ``MCDropout``."""
  return as_posterior(params).apply_options(key)
