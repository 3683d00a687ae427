"""Bayesianize a flax model written with flax's own layers, without editing its code.

``bayesianize(model, estimator)`` runs ``model`` with each ``nn.Dense``,
``nn.DenseGeneral``, ``nn.Conv``, ``nn.Embed`` and ``nn.LSTMCell`` replaced by its
Bayesian twin (flax method interception), each weight ``w`` become ``w_loc`` and
``w_scale`` with ``w``'s shape and axes; ``moped_init`` starts it from the model's
trained parameters. An ``nn.RNN``'s cells lose their KL: scan with ``RNN``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
from flax import traverse_util

from meshbayes.layers.conv import conv_class
from meshbayes.layers.dense import (DENSE_ESTIMATORS, ESTIMATORS, GROUPED, dense_class,
                                    dense_general_class)
from meshbayes.layers.embed import embed_class
from meshbayes.layers.lstm import lstm_cell_class
from meshbayes.layers.moped import moped_params
from meshbayes.layers.priors import NormalPrior, Prior

# The flax layers bayesianize replaces, by class name, and the function giving the
# Bayesian class of an estimator name (tests/layers/test_layer_lists.py fails while a
# Bayesian twin of a flax layer is missing here).
_TWINS: dict[str, tuple[type[nn.Module], Callable[[str], type[nn.Module]]]] = {
    "Dense": (nn.Dense, dense_class),
    "DenseGeneral": (nn.DenseGeneral, dense_general_class),
    "Conv": (nn.Conv, conv_class),
    "Embed": (nn.Embed, embed_class),
    "LSTMCell": (nn.LSTMCell, lstm_cell_class),
}
_DETERMINISTIC = "deterministic"
# The layer types whose twins offer more than ``ESTIMATORS``: the Dense layers, the grouped one.
_DENSE_TYPES = ("Dense", "DenseGeneral")


def _offered(name: str) -> tuple[str, ...]:
  return DENSE_ESTIMATORS if name in _DENSE_TYPES else ESTIMATORS


def _layer_estimators(estimator: str | Mapping[str | type, str]) -> tuple[tuple[str, str], ...]:
  """``(layer type name, estimator)`` pairs of the layer types to replace, validated."""
  if isinstance(estimator, str):
    # The union of the families' estimators: one a type lacks (the grouped one for Conv) is
    # an error only for a model that has a layer of that type, when it is met.
    if estimator not in DENSE_ESTIMATORS:
      raise ValueError(f"bayesianize: estimator={estimator!r} is not one of "
                       f"{', '.join(DENSE_ESTIMATORS)}")
    chosen = {name: estimator for name in _TWINS}
  else:
    chosen = {(key.__name__ if isinstance(key, type) else key): value
              for key, value in estimator.items()}
  for name, value in chosen.items():
    if name not in _TWINS:
      raise ValueError(f"bayesianize: layer type {name!r} is not one of {', '.join(_TWINS)}")
    if value not in _offered(name):
      raise ValueError(f"bayesianize: estimator={value!r} for {name} is not one of "
                       f"{', '.join(_offered(name))}")
  return tuple(sorted((n, e) for n, e in chosen.items() if e != _DETERMINISTIC))


def _twin_attributes(layer: nn.Module, twin: type[nn.Module]) -> dict[str, Any]:
  """The flax layer's attributes that the twin shares; the others must keep their defaults."""
  twin_fields = {f.name for f in dataclasses.fields(twin)}
  shared = {}
  for field in dataclasses.fields(layer):
    if field.name in ("parent", "name"):
      continue
    value = getattr(layer, field.name)
    if field.name in twin_fields:
      shared[field.name] = value
    elif value is not field.default and not (isinstance(value, (str, int, float, tuple))
                                             and value == field.default):
      raise ValueError(f"bayesianize: {type(layer).__name__} {layer.name!r} sets {field.name}, "
                       f"which {twin.__name__} does not support (only its default "
                       f"{field.default!r}); leave it unset or exclude the layer type")
  return shared


class Bayesianized(nn.Module):
  """A flax model whose Dense, DenseGeneral, Conv and Embed layers are Bayesian.

  Called like the model (its ``__call__``), it has the model's parameter tree
  (the wrapper shares the model's scope), except that each replaced layer holds
  ``kernel_loc`` and ``kernel_scale`` (``embedding_loc``, ``embedding_scale``)
  with the deterministic weight's shape and logical axes. Sampling layers
  draw from the ``'sample'`` rng and record their KL in ``'losses'``; the
  posterior mean is ``clone(deterministic=True)``. Another method of the model
  runs through ``call_method`` (``apply(..., method=lambda m, x:
  m.call_method('encode', x))``). Usually built by ``bayesianize``.

  Attributes:
    module: the deterministic flax model, unchanged.
    estimators: ``(layer type, estimator)`` pairs, e.g. ``(('Dense', 'flipout'),)``:
      the flax layer types (class names) to replace and the estimator of each.
    prior: prior of every Bayesian weight (default N(0, 1)).
    bayesian_bias: give the biases of Dense and Conv layers a posterior too.
    deterministic: every Bayesian layer uses its posterior mean (one pass,
      no rng); None samples.
    num_weight_groups: the weight samples per call of the layers whose estimator
      is ``grouped_reparameterization`` (one per equal group of the batch; see
      ``meshbayes.layers.Dense``); the other layers take none.
  """

  module: nn.Module
  estimators: tuple[tuple[str, str], ...]
  prior: Prior = NormalPrior()
  bayesian_bias: bool = False
  deterministic: bool | None = None
  num_weight_groups: int = 1

  def setup(self):
    nn.share_scope(self, self.module)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    """Calls the model with its layers replaced; arguments are the model's.

    Returns:
      What the model returns.
    """
    return self.call_method("__call__", *args, **kwargs)

  def call_method(self, method: str, *args: Any, **kwargs: Any) -> Any:
    """Calls the model's method ``method`` with its layers replaced.

    Returns:
      What the method returns.
    """
    # Classes looked up when a layer of the type is met: an estimator one type lacks
    # (local reparameterization for LSTM cells) is an error only for a model that has it.
    replace = {_TWINS[name][0]: functools.partial(_TWINS[name][1], estimator)
               for name, estimator in self.estimators}
    # A compact layer's scope is rewound after each call, so a twin serves one call;
    # a setup layer (nn.Embed) keeps its scope, so its twin, which sets up once, is kept.
    twins: dict[tuple[int, int], tuple[nn.Module, nn.Module]] = {}

    def interceptor(next_fun, args, kwargs, context):
      layer = context.module
      twin_class = replace[type(layer)]() if type(layer) in replace else None
      # Methods the twin lacks (a lifted transform's wrapper, as nn.RNN's scan) run as
      # written and reach the layer's own methods, which are intercepted in turn.
      if twin_class is None or not hasattr(twin_class, context.method_name):
        return next_fun(*args, **kwargs)
      if context.method_name == "setup":
        return None  # the twin creates the parameters, not the flax layer
      key = (id(layer), id(layer.scope))
      if key not in twins:
        attributes = _twin_attributes(layer, twin_class)
        twin_fields = {f.name for f in dataclasses.fields(twin_class)}
        for name, value in (("prior", self.prior), ("bayesian_bias", self.bayesian_bias),
                            ("deterministic", self.deterministic)):
          if name in twin_fields:  # nn.Embed's twin has no bias
            attributes[name] = value
        if getattr(twin_class, "estimator", None) == GROUPED:
          attributes["num_weight_groups"] = self.num_weight_groups
        twins[key] = layer, twin_class(**attributes, parent=layer.scope, name=layer.name)
      return getattr(twins[key][1], context.method_name)(*args, **kwargs)

    with nn.intercept_methods(interceptor):
      return getattr(self.module, method)(*args, **kwargs)


def bayesianize(module: nn.Module, estimator: str | Mapping[str | type, str] = "flipout", *,
                prior: Prior = NormalPrior(), bayesian_bias: bool = False,
                deterministic: bool | None = None, num_weight_groups: int = 1) -> Bayesianized:
  """The Bayesian version of a flax model built from flax's own layers.

  Args:
    module: a flax model using ``nn.Dense``, ``nn.DenseGeneral``, ``nn.Conv``
      and ``nn.Embed``; its code is not touched.
    estimator: one estimator name for every layer type (``'reparameterization'``,
      ``'flipout'``, ``'local_reparameterization'``), or a mapping from layer type
      (the flax class or its name, ``'Dense'``) to an estimator name; types left
      out, or mapped to ``'deterministic'``, keep the flax layer. Dense and
      DenseGeneral also take ``'grouped_reparameterization'``.
    prior: prior of every Bayesian weight.
    bayesian_bias: give Dense and Conv biases a posterior too.
    deterministic: use posterior means instead of sampling.
    num_weight_groups: the grouped reparameterization's samples per call.

  Returns:
    A ``Bayesianized`` module, called with the model's arguments.

  Raises:
    ValueError: an unknown layer type or estimator name.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import total_kl
    >>> from meshbayes.layers.bayesianize import bayesianize
    >>> class MLP(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.Dense(2, name='out')(nn.relu(nn.Dense(8, name='hidden')(x)))
    >>> model = bayesianize(MLP(), {'Dense': 'local_reparameterization'})
    >>> x = jnp.ones((4, 3))
    >>> variables = model.init(jax.random.key(0), x)
    >>> jax.tree_util.tree_map(jnp.shape, variables['params']['hidden'])
    {'bias': (8,), 'kernel_loc': (3, 8), 'kernel_scale': (3, 8)}
    >>> y, state = model.apply(variables, x, rngs={'sample': jax.random.key(1)},
    ...                        mutable=['losses'])
    >>> y.shape, bool(total_kl(state) > 0)
    ((4, 2), True)
  """
  return Bayesianized(module, _layer_estimators(estimator), prior=prior,
                      bayesian_bias=bayesian_bias, deterministic=deterministic,
                      num_weight_groups=num_weight_groups)


def moped_init(model: Bayesianized, deterministic_variables: Mapping[str, Any], *args: Any,
               delta: float = 0.1, min_stddev: float = 1e-6, **kwargs: Any) -> dict[str, Any]:
  """The Bayesian model's variables from the deterministic model's trained ones (MOPED).

  Posterior means are the trained weights, posterior stddevs ``delta * |w|``
  (see ``moped_params``); every other parameter and collection (biases,
  norms, ``batch_stats``) is copied. The Bayesian parameter tree, with its
  logical axes, is traced from ``args`` without allocating it; only the
  parameters the deterministic model lacks (a trainable prior's scalars) are
  initialized.

  Args:
    model: the bayesianized model.
    deterministic_variables: the deterministic model's variables, with ``'params'``.
    *args: example inputs of the model (shapes matter, values do not).
    delta: posterior stddev as a fraction of ``|w|``.
    min_stddev: floor of the stddev, for weights at 0.
    **kwargs: further keyword arguments of the model's call.

  Returns:
    Variables of ``model``; at ``deterministic=True`` it computes what the
    deterministic model computes with ``deterministic_variables``.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers.bayesianize import bayesianize, moped_init
    >>> net, x = nn.Dense(3), jnp.ones((2, 4))
    >>> trained = net.init(jax.random.key(0), x)
    >>> bayesian = bayesianize(net, 'flipout', deterministic=True)
    >>> variables = moped_init(bayesian, trained, x)
    >>> bool(jnp.all(bayesian.apply(variables, x) == net.apply(trained, x)))
    True
  """
  init = lambda key: model.init(key, *args, **kwargs)
  abstract = jax.eval_shape(init, jax.random.key(0))
  params = moped_params(abstract["params"], deterministic_variables["params"], delta=delta,
                        min_stddev=min_stddev)
  flat = traverse_util.flatten_dict(params)
  is_abstract = lambda v: isinstance(nn.unbox(v), jax.ShapeDtypeStruct)
  if any(is_abstract(v) for v in flat.values()):
    initialized = traverse_util.flatten_dict(jax.jit(init)(jax.random.key(0))["params"])
    params = traverse_util.unflatten_dict(
        {path: initialized[path] if is_abstract(v) else v for path, v in flat.items()})
  return {**deterministic_variables, "params": params}
