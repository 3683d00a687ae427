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
import numpy as np
from flax import traverse_util

from meshbayes.layers.variational import posterior_part
from meshbayes.training.ivon import IVON_META

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


def posterior_moments(saved: dict[str, np.ndarray], meta: dict[str, Any]
                      ) -> tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
  """A checkpoint's posterior: ``(description, {weight: (mean, stddev)})``, float64.

  Of its Bayesian layers (``*_loc``, softplus of ``*_scale``), or of an IVON run's
  optimizer state (the parameters and ``1/sqrt(ess (hessian + weight_decay))``);
  empty for a deterministic run. ``saved`` is ``checkpoints.read_arrays``'s.
  """
  arrays = {k[len("params/"):]: v for k, v in saved.items() if k.startswith("params/")}
  ivon = meta.get(IVON_META)
  if ivon:  # the posterior is the optimizer's: stddev from its Hessian estimate
    prefix = "opt_state/hessian/"
    return (f"posterior standard deviation (IVON: 1/sqrt(ess * (hessian + weight_decay)), "
            f"ess={ivon['ess']:.6g}, weight_decay={ivon['weight_decay']:.6g}) per weight:",
            {k[len(prefix):]: (arrays[k[len(prefix):]].astype(np.float64), 1.0 / np.sqrt(
                ivon["ess"] * (v.astype(np.float64) + ivon["weight_decay"])))
             for k, v in saved.items() if k.startswith(prefix)})
  return ("posterior standard deviation (softplus of *_scale) per weight:",
          {name[:-len("_scale")]: (arrays[name[:-len("_scale")] + "_loc"].astype(np.float64),
                                   np.logaddexp(0.0, v.astype(np.float64)))
           for name, v in arrays.items()
           if posterior_part(name.rsplit("/", 1)[-1]) is not None and name.endswith("_scale")})
