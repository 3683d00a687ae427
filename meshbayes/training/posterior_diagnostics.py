"""Whether a posterior has converged: its median stddev per layer group over training.

The trainer logs ``posterior_stddev_median/<group>`` at each periodic evaluation;
``relative_change`` reads the end of that curve: stddevs still moving over the
last tenth of a run are a point on the optimizer's path, not the ELBO's optimum.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

Array = jax.Array
MEDIAN_PREFIX = "posterior_stddev_median/"
# Path parts naming a layer of a stack (scanned or not): not part of a group's name.
_LAYER = re.compile(r"layers(_\d+)?$")


def layer_stddevs(params: Any) -> dict[str, Array]:
  """Bayesian layers' posterior stddevs ``softplus(w_scale)`` by ``/``-joined path."""
  flat = traverse_util.flatten_dict(params, sep="/")
  return {k: jax.nn.softplus(v.astype(jnp.float32)) for k, v in flat.items()
          if k.endswith("_scale") and "_prior_" not in k}


def layer_group(path: str) -> str:
  """The group of a weight's ``/``-joined path: its modules without layer indices and
  without the projection itself (``encoder/layers_3/attention/query/kernel_scale`` is
  ``encoder/attention``).

  >>> layer_group('decoder/layers/mlp/wi_0/kernel_scale'), layer_group('Dense_0/kernel')
  ('decoder/mlp', 'Dense_0')
  """
  modules = [part for part in path.split("/")[:-1] if not _LAYER.match(part)]
  return "/".join(modules[:-1] if len(modules) > 1 else modules)


def median_stddevs(stddevs: Mapping[str, Array]) -> dict[str, Array]:
  """The median stddev of each group's weights, keyed ``MEDIAN_PREFIX + group`` (jit-able:
  a sort of each group's weights, so written at evaluations, not at every step).

  Args:
    stddevs: ``/``-joined path -> stddevs (``layer_stddevs``, or an IVON posterior's,
      flattened).
  """
  groups: dict[str, list[Array]] = {}
  for path, value in sorted(stddevs.items()):
    groups.setdefault(layer_group(path), []).append(jnp.ravel(value))
  return {MEDIAN_PREFIX + group: jnp.median(jnp.concatenate(values))
          for group, values in groups.items()}


def relative_change(curve: Sequence[tuple[int, float]], fraction: float = 0.1
                    ) -> tuple[int, int, float]:
  """``(from_step, to_step, last / earlier - 1)`` over the last ``fraction`` of a curve.

  The earlier point is the first at or after ``(1 - fraction)`` of the last step
  (the curve's points are the evaluations, so the span may be a little shorter).

  >>> relative_change([(100, 1.0), (900, 2.0), (1000, 2.2)])
  (900, 1000, 0.10000000000000009)
  """
  points = sorted(curve)
  if len(points) < 2:
    raise ValueError(f"relative_change: {len(points)} point(s); needs two or more")
  last_step, last = points[-1]
  start, earlier = next((s, v) for s, v in points if s >= (1 - fraction) * last_step)
  if start == last_step:
    start, earlier = points[-2]
  return start, last_step, last / earlier - 1
