"""MOPED (Krishnan et al., 2020): a Bayesian model's posterior started from a deterministic model.

Posterior means are the trained weights, standard deviations ``delta * |w|``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import traverse_util
from flax.core import meta

from meshbayes.layers.initializers import softplus_inverse
from meshbayes.layers.variational import posterior_part

_SCALE = "_scale"


def _unbox(x: Any) -> Any:
  return x.unbox() if isinstance(x, meta.AxisMetadata) else x


def _rebox(like: Any, value: Any) -> Any:
  return like.replace_boxed(value) if isinstance(like, meta.AxisMetadata) else value


def _twin(key: tuple[str, ...]) -> tuple[tuple[str, ...], str] | None:
  """For ``(..., 'kernel_loc')`` returns ``((..., 'kernel'), '_loc')``; None otherwise."""
  part = posterior_part(key[-1])
  return (key[:-1] + (part[0],), f"_{part[1]}") if part else None


def moped_params(bayesian_params: Mapping[str, Any], deterministic_params: Mapping[str, Any],
                 delta: float = 0.1, min_stddev: float = 1e-6) -> dict[str, Any]:
  """Bayesian parameters with means from deterministic weights and stddevs ``delta * |w|``.

  Every ``<w>_loc`` becomes the deterministic ``<w>``, every ``<w>_scale`` the
  unconstrained value of ``max(delta * |w|, min_stddev)``, every parameter the
  two models share (deterministic biases, norms) is copied, and parameters
  only the Bayesian model has (trainable prior scalars) are kept. Boxed
  (partitioned) values stay boxed.

  Args:
    bayesian_params: the Bayesian model's ``params`` collection (initialized).
    deterministic_params: the deterministic twin's ``params`` (trained).
    delta: posterior stddev as a fraction of ``|w|``; must be > 0.
    min_stddev: floor of the stddev, for weights at 0.

  Returns:
    A new nested dict of Bayesian parameters.

  Raises:
    ValueError: a deterministic weight has no Bayesian counterpart or a
      different shape.

  >>> import jax.numpy as jnp
  >>> bayes = {'dense': {'kernel_loc': jnp.zeros(2), 'kernel_scale': jnp.zeros(2)}}
  >>> params = moped_params(bayes, {'dense': {'kernel': jnp.array([1.0, -2.0])}})
  >>> params['dense']['kernel_loc'].tolist()
  [1.0, -2.0]
  """
  if not delta > 0:
    raise ValueError(f"moped_params: delta={delta!r} must be a positive number")
  bayes = traverse_util.flatten_dict(dict(bayesian_params))
  det = traverse_util.flatten_dict(dict(deterministic_params))
  used = set()
  out = {}
  for key, value in bayes.items():
    twin = _twin(key)
    source_key, suffix = twin if twin and twin[0] in det else (key, "")
    if source_key not in det:
      out[key] = value
      continue
    used.add(source_key)
    w = jnp.asarray(_unbox(det[source_key]))
    if w.shape != _unbox(value).shape:
      raise ValueError(f"moped_params: {'/'.join(source_key)} has shape {w.shape} in the "
                       f"deterministic model but {_unbox(value).shape} as {'/'.join(key)}")
    if suffix == _SCALE:
      w = softplus_inverse(jnp.maximum(delta * jnp.abs(w.astype(jnp.float32)), min_stddev))
    out[key] = _rebox(value, w.astype(_unbox(value).dtype))
  unused = sorted("/".join(k) for k in det.keys() - used)
  if unused:
    raise ValueError(f"moped_params: deterministic parameters without a Bayesian counterpart: "
                     f"{', '.join(unused)}")
  return traverse_util.unflatten_dict(out)
