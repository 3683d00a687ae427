"""What every Bayesian layer does the same way: its variational parameters, their axes, the KL.

A weight ``w`` becomes ``w_loc`` and ``w_scale`` (``stddev = softplus(w_scale)``)
with the deterministic parameter's shape and logical axes, from ``*_axes``
(T5X style) or a boxed initializer (flax style); both give identical boxes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util
from flax.core import meta

from meshbayes.layers.estimators import Normal
from meshbayes.layers.initializers import softplus_inverse
from meshbayes.layers.kl import KL_COLLECTION, KL_NAME
from meshbayes.layers.priors import Prior

Array = jax.Array
Initializer = Callable[..., Any]
Axes = Sequence[str | None] | None

SAMPLE_RNG = "sample"
_PRIOR_INFIX = "_prior_"


def posterior_part(name: str) -> tuple[str, str] | None:
  """The weight and role of a variational parameter's name, None for any other parameter.

  ``'kernel_loc'`` gives ``('kernel', 'loc')`` and ``'kernel_scale'``
  ``('kernel', 'scale')``. A prior's trainable scalars (``kernel_prior_loc``,
  empirical Bayes) are point estimates: None, so they are neither sampled
  nor counted as weights.

  >>> posterior_part('kernel_scale'), posterior_part('kernel_prior_loc'), posterior_part('bias')
  (('kernel', 'scale'), None, None)
  """
  if _PRIOR_INFIX in name:
    return None
  for role in ("loc", "scale"):
    if name.endswith("_" + role):
      return name[:-len(role) - 1], role
  return None


def _unbox(value: Any) -> Any:
  return value.unbox() if isinstance(value, meta.AxisMetadata) else value


def reshaped_init(init: Initializer, flat_shape: Callable[[tuple[int, ...]], tuple[int, ...]]
                  ) -> Initializer:
  """Calls ``init`` on ``flat_shape(shape)`` and reshapes, as flax's ``DenseGeneral`` does.

  Initializers that compute a fan-in see a multi-axis kernel as a 2-D matrix,
  and a box returned by ``init`` keeps its metadata.
  """

  def wrapped(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Any:
    shape = tuple(shape)
    value = init(key, flat_shape(shape), dtype)
    if isinstance(value, meta.AxisMetadata):
      return value.replace_boxed(jnp.reshape(value.unbox(), shape))
    return jnp.reshape(value, shape)

  return wrapped


def partitioning_box(module: nn.Module, param: str, init: Initializer, shape: tuple[int, ...],
                     dtype: Any, axes: Axes) -> meta.AxisMetadata | None:
  """The partitioning box the deterministic parameter ``param`` would carry.

  Args:
    module: the layer (named in errors).
    param: the deterministic parameter's name (``'kernel'``).
    init: its initializer, possibly boxed.
    shape: its shape.
    dtype: its dtype.
    axes: logical axis names given by the layer's attribute, or None.

  Returns:
    An abstract box (its value is a ``ShapeDtypeStruct``), or None when the
    parameter carries no partitioning metadata.
  """
  abstract = jax.eval_shape(lambda: init(jax.random.key(0), shape, dtype))
  box = abstract if isinstance(abstract, meta.AxisMetadata) else None
  owner = f"{type(module).__name__} {module.name!r}"
  if axes is not None:
    axes = tuple(axes)
    names = getattr(box, "names", axes)
    if tuple(names) != axes:
      raise ValueError(f"{owner}: {param}_axes={axes} disagrees with the axes {tuple(names)} "
                       f"of its boxed initializer; give the axes in one place")
    if box is None:
      box = nn.LogicallyPartitioned(abstract, axes)
  names = getattr(box, "names", None)
  if names is not None and len(names) != len(shape):
    raise ValueError(f"{owner}: {param} axes {tuple(names)} name {len(names)} dimensions but "
                     f"{param} has shape {shape}; give one logical axis name (or None) per dimension")
  return box


def constrain_like(box: meta.AxisMetadata | None) -> Callable[[Array], Array]:
  """A sharding constraint that places an array like the parameter in ``box``.

  Used for weight-shaped noise, so each device draws only its own shard. It is
  the identity without logical axes, and outside a mesh and rules context.
  """
  if not isinstance(box, nn.LogicallyPartitioned):
    return lambda x: x
  return functools.partial(nn.with_logical_constraint, logical_axis_resources=tuple(box.names))


def boxed_init(box: meta.AxisMetadata | None, init: Initializer) -> Initializer:
  """``init`` whose (unboxed) value is put in ``box``, or left plain when ``box`` is None."""
  if box is None:
    return lambda *args: _unbox(init(*args))
  return lambda *args: box.replace_boxed(_unbox(init(*args)))


@jax.custom_vjp
def stddev_of_scale(scale: Array) -> Array:
  """``softplus(scale)``, whose gradient ``sigmoid(scale)`` is recomputed from ``scale``.

  Differentiated as ``jax.nn.softplus``, a layer inside a scan stored its
  derivative (and the stddev) as weight-sized arrays for the backward pass;
  ``scale``, a parameter, is there already.

  >>> round(float(stddev_of_scale(jnp.float32(0.0))), 4)
  0.6931
  """
  return jax.nn.softplus(scale)


def _stddev_forward(scale: Array) -> tuple[Array, Array]:
  return jax.nn.softplus(scale), scale


def _stddev_backward(scale: Array, grad: Array) -> tuple[Array]:
  return (grad * jax.nn.sigmoid(scale),)


stddev_of_scale.defvjp(_stddev_forward, _stddev_backward)


def variational_param(module: nn.Module, name: str, shape: tuple[int, ...], loc_init: Initializer,
                      stddev_init: Initializer, box: meta.AxisMetadata | None,
                      dtype: Any) -> Normal:
  """Creates ``{name}_loc`` and ``{name}_scale`` and returns the posterior.

  Args:
    module: the layer creating the parameters.
    name: the deterministic parameter's name (``'kernel'``).
    shape: its shape.
    loc_init: initializer of the posterior mean (the deterministic twin's).
    stddev_init: initializer of the posterior standard deviation.
    box: the partitioning box of the deterministic parameter (both new
      parameters get it), from ``partitioning_box``.
    dtype: parameter dtype.

  Returns:
    ``Normal(loc, softplus(scale), scale)``, in ``dtype``.
  """
  loc = module.param(f"{name}_loc", boxed_init(box, loc_init), shape, dtype)
  scale_init = lambda *args: softplus_inverse(_unbox(stddev_init(*args)))
  scale = module.param(f"{name}_scale", boxed_init(box, scale_init), shape, dtype)
  return Normal(loc, stddev_of_scale(scale), scale)


def sample_layer_weights(params: Any, key: Array) -> dict[str, Any]:
  """One posterior sample of every weight: ``w_loc`` becomes ``w_loc + softplus(w_scale) * eps``.

  A model applied to the result at its posterior mean (``deterministic=True``)
  runs with the sampled weights, so one sample can serve many calls (the
  steps of a decode) while its noise is drawn once. Other parameters, and
  boxes, are kept (a prior's trainable scalars included). Posteriors held
  outside the layers draw their own (``posteriors.sample_weights`` takes either).

  Args:
    params: a ``params`` collection of Bayesian layers.
    key: PRNG key of the sample.

  Returns:
    A new nested dict; the ``*_scale`` parameters are unchanged.

  >>> params = {'dense': {'kernel_loc': jnp.zeros(3), 'kernel_scale': jnp.full(3, -30.0)}}
  >>> sample = sample_layer_weights(params, jax.random.key(0))
  >>> bool(jnp.allclose(sample['dense']['kernel_loc'], 0.0, atol=1e-9))
  True
  """
  flat = traverse_util.flatten_dict(dict(params))
  out = {}
  for index, (path, value) in enumerate(sorted(flat.items())):
    scale = _scale_of(path, flat)
    if scale is not None:
      posterior = Normal(_unbox(value), jax.nn.softplus(_unbox(flat[scale])))
      sample = posterior.sample(jax.random.fold_in(key, index))
      value = value.replace_boxed(sample) if isinstance(value, meta.AxisMetadata) else sample
    out[path] = value
  return traverse_util.unflatten_dict(out)


def _scale_of(path: tuple[str, ...], flat: dict[tuple[str, ...], Any]) -> tuple[str, ...] | None:
  """The path of the ``*_scale`` beside a posterior mean ``path``, None for other parameters."""
  part = posterior_part(path[-1])
  scale = path[:-1] + (f"{part[0]}_scale",) if part and part[1] == "loc" else None
  return scale if scale in flat else None


def layer_sample_axes(params: Any) -> Any:
  """``0`` for each leaf of ``sample_layer_weights``' output that a sample draws, ``None``
  for each it keeps: the ``in_axes``/``out_axes`` that stack over samples only what differs.

  >>> layer_sample_axes({'dense': {'kernel_loc': 0.0, 'kernel_scale': 0.0, 'bias': 0.0}})
  {'dense': {'bias': None, 'kernel_loc': 0, 'kernel_scale': None}}
  """
  flat = traverse_util.flatten_dict(dict(params))
  return traverse_util.unflatten_dict(
      {path: 0 if _scale_of(path, flat) else None for path in sorted(flat)})


def use_posterior_mean(module: nn.Module, deterministic: bool | None) -> bool:
  """Resolves ``deterministic`` (call argument, then attribute, then False).

  Returns True when the layer must use the posterior mean: when asked to, and
  during ``init`` without a ``'sample'`` rng (shapes do not depend on it).

  Raises:
    ValueError: sampling was asked for but no ``'sample'`` rng was given.
  """
  if deterministic is None:
    deterministic = module.deterministic
  if deterministic:
    return True
  if module.has_rng(SAMPLE_RNG):
    return False
  if module.is_initializing():
    return True
  raise ValueError(
      f"{type(module).__name__} {module.name!r} samples its weights and needs a "
      f"'{SAMPLE_RNG}' rng: pass rngs={{'{SAMPLE_RNG}': key}} to apply, or use the "
      "posterior mean: the layer's deterministic=True (a bayesianize'd model: "
      "model.clone(deterministic=True))")


def _kl(prior: Prior, posterior: Normal, params: dict[str, Array], key: Array) -> Array:
  """``prior.kl`` of the posterior; with a ``scale``, its stddev is recomputed in the
  backward pass from ``scale`` (a parameter) instead of kept, weight-sized, per layer."""
  if posterior.scale is None:
    return prior.kl(posterior.loc, posterior.stddev, params, key)
  kl = lambda loc, scale, params, key: prior.kl(loc, stddev_of_scale(scale), params, key)
  return jax.checkpoint(kl, policy=jax.checkpoint_policies.nothing_saveable)(
      posterior.loc, posterior.scale, params, key)


def record_kl(module: nn.Module, terms: Sequence[tuple[str, Prior, Normal]]) -> None:
  """Records the layer's KL, the sum over its ``(name, prior, posterior)`` terms.

  Nothing is computed unless the ``KL_COLLECTION`` is mutable, and ``init``
  only creates the parameters (its variables hold no KL). A prior's trainable
  scalars become parameters ``{name}_prior_{key}`` (replicated).
  Monte Carlo priors draw from the ``'sample'`` stream when there is one and
  from a fixed key otherwise (posterior-mean evaluation stays deterministic).
  """
  if not module.is_mutable_collection(KL_COLLECTION):
    return
  kl = jnp.zeros((), jnp.float32)
  for name, prior, posterior in terms:
    params = {
        key: module.param(f"{name}_prior_{key}",
                          nn.with_logical_partitioning(nn.initializers.constant(value), ()),
                          (), jnp.float32)
        for key, value in prior.trainable_init().items()
    }
    rng = module.make_rng(SAMPLE_RNG) if module.has_rng(SAMPLE_RNG) else jax.random.key(0)
    kl = kl + _kl(prior, posterior, params, rng)
  if not module.is_initializing():
    module.sow(KL_COLLECTION, KL_NAME, kl,
               init_fn=lambda: jnp.zeros((), jnp.float32), reduce_fn=lambda _, new: new)
