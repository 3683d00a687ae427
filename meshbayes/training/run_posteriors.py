"""The posteriors a run's checkpoint holds, and how each is restored: the registry
``checkpoint_restore`` asks, which names no kind itself.

A run is restored as its parameters (``PARAMETERS``: point weights, or Bayesian layers
whose posterior lives in them) unless its training kept a posterior beside them and its
checkpoint's metadata records it under a registered ``RunPosterior.meta_key``. Such an
entry names the checkpoint subtrees its posterior is built from besides ``params`` and
builds it, a ``layers.posteriors.Posterior`` (a registered kind), which evaluation and
decoding take in place of the parameters. Posteriors built after a run is restored (MC
dropout, an ensemble, Laplace) are predictive methods (``evaluation.methods``).
Adding either: docs/posteriors.md.

>>> held_by({"ivon": {"ess": 1000.0, "weight_decay": 1e-4}}).name, held_by({}).name
('ivon', 'parameters')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from meshbayes.training import ivon

# (params' shapes, the meta's record) -> {subtree: shapes}: what to restore besides params.
State = Callable[[Any, Any], dict[str, Any]]
# (the restored subtrees, "params" among them; the meta's record) -> the posterior.
Build = Callable[[dict[str, Any], Any], Any]


@dataclasses.dataclass(frozen=True)
class RunPosterior:
  """How a checkpoint that holds a posterior is restored as it.

  Attributes:
    name: the kind's name (``names()``).
    title: what its runs are called in messages, e.g. ``IVON``.
    meta_key: the checkpoint metadata key whose (truthy) record marks a run of this kind
      and holds its settings; None only for ``PARAMETERS``, which holds when none does.
    state: ``state(params_shapes, record)``: the checkpoint subtrees besides ``params``
      that ``build`` reads, as ``jax.ShapeDtypeStruct`` trees.
    build: ``build(restored, record)``: the posterior, from the restored subtrees
      (``params`` and ``state``'s) placed on the mesh.
  """

  name: str
  title: str
  meta_key: str | None
  state: State
  build: Build

  def holds(self, meta: Mapping[str, Any]) -> bool:
    """Whether a checkpoint with metadata ``meta`` holds this kind."""
    return self.meta_key is not None and bool(meta.get(self.meta_key))

  def record(self, meta: Mapping[str, Any]) -> Any:
    """This kind's settings in ``meta`` (None for ``PARAMETERS``)."""
    return meta.get(self.meta_key) if self.meta_key is not None else None


PARAMETERS = RunPosterior("parameters", "parameters as trained", None,
                          state=lambda params, record: {},
                          build=lambda restored, record: restored["params"])

_RUN_POSTERIORS: dict[str, RunPosterior] = {}


def register(kind: RunPosterior) -> RunPosterior:
  """Adds ``kind`` to the registry (a name or meta key registered twice is refused)."""
  if kind.meta_key is None:
    raise ValueError(f"register: run posterior {kind.name!r} needs a meta_key (the checkpoint "
                     "record that marks its runs)")
  for other in (PARAMETERS, *_RUN_POSTERIORS.values()):
    if kind.name == other.name or kind.meta_key == other.meta_key:
      raise ValueError(f"register: run posterior {kind.name!r} (meta key {kind.meta_key!r}) "
                       f"clashes with the registered {other.name!r}")
  _RUN_POSTERIORS[kind.name] = kind
  return kind


def names() -> tuple[str, ...]:
  """The registered kinds' names, ``PARAMETERS``' first."""
  return (PARAMETERS.name, *_RUN_POSTERIORS)


def held_by(meta: Mapping[str, Any]) -> RunPosterior:
  """The kind a checkpoint with metadata ``meta`` holds: the registered one whose record
  it has, else ``PARAMETERS``.

  Raises:
    ValueError: it records two kinds (one line naming them).
  """
  held = [kind for kind in _RUN_POSTERIORS.values() if kind.holds(meta)]
  if len(held) > 1:
    raise ValueError(f"the checkpoint records {len(held)} posteriors "
                     f"({', '.join(kind.name for kind in held)}); a run holds at most one")
  return held[0] if held else PARAMETERS


register(RunPosterior("ivon", "IVON", ivon.IVON_META, ivon.checkpoint_state,
                      ivon.checkpoint_posterior))
