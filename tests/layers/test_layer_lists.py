"""The lists a new layer must join, checked against the layers themselves.

A layer is a public ``nn.Module`` subclass with a ``__call__`` defined in a module of
``meshbayes/layers/`` (docs/layers.md, "Adding a layer"). Each is exported by
``meshbayes.layers`` (eagerly, or lazily from its TensorFlow Probability module), named
on docs/layers.md, and, when it is the Bayesian twin of a flax layer, replaces that
layer in ``bayesianize``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp

from meshbayes import layers

# The module (``meshbayes.layers.bayesianize`` is the package's function of that name).
bayesianize = importlib.import_module("meshbayes.layers.bayesianize")

LAYERS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "layers.md"
# Flax twins that bayesianize reaches through the flax layers they are built of.
BUILT_OF_TWINS = {"MultiHeadDotProductAttention": "DenseGeneral"}


def _layer_classes() -> dict[str, tuple[str, type[nn.Module]]]:
  """``{class name: (module name, class)}`` of every layer defined in meshbayes/layers."""
  found = {}
  for info in pkgutil.iter_modules(layers.__path__):
    module = importlib.import_module(f"meshbayes.layers.{info.name}")
    for name, value in vars(module).items():
      if (inspect.isclass(value) and issubclass(value, nn.Module) and not name.startswith("_")
          and value.__module__ == module.__name__
          and any("__call__" in vars(k) for k in value.__mro__
                  if k.__module__.startswith("meshbayes."))):
        found[name] = (info.name, value)
  return found


LAYER_CLASSES = _layer_classes()


def _camel(estimator: str) -> str:
  return "".join(part.title() for part in estimator.split("_"))


def _flax_twins() -> dict[str, list[type[nn.Module]]]:
  """``{flax class name: its Bayesian classes}``: a Bayesian class is named after its twin
  and its estimator (``DenseFlipout``: ``nn.Dense``, ``'flipout'``)."""
  twins: dict[str, list[type[nn.Module]]] = {}
  for name, (_, cls) in LAYER_CLASSES.items():
    estimator = getattr(cls, "estimator", None)
    if isinstance(estimator, str) and estimator != "deterministic":
      twin = name.removesuffix(_camel(estimator))
      if twin != name and hasattr(nn, twin):
        twins.setdefault(twin, []).append(cls)
  return twins


def test_the_layer_lists_see_the_layers():
  assert len(LAYER_CLASSES) >= 40 and "DenseFlipout" in LAYER_CLASSES
  assert "ConvBase" not in LAYER_CLASSES  # a base without a call is no layer
  assert set(_flax_twins()) == {"Dense", "DenseGeneral", "Conv", "Embed", "LSTMCell",
                                "MultiHeadDotProductAttention"}


def test_every_layer_is_exported_eagerly_or_from_its_lazy_module():
  missing = [name for name in LAYER_CLASSES if name not in layers.__all__]
  assert not missing, f"meshbayes/layers/__init__.py does not export {missing}"
  for name, (module, cls) in LAYER_CLASSES.items():
    assert getattr(layers, name) is cls, name
    lazy = module in layers._LAZY_MODULES  # pylint: disable=protected-access
    assert (name in layers._LAZY_MODULES.get(module, ())) == lazy, (  # pylint: disable=protected-access
        f"{name} of meshbayes.layers.{module} is not in _LAZY_MODULES[{module!r}]")


def test_the_exports_are_listed_once_and_resolve():
  assert len(layers.__all__) == len(set(layers.__all__))
  assert [name for name in layers.__all__ if not hasattr(layers, name)] == []
  lazy_modules = {f"meshbayes.layers.{m}" for m in layers._LAZY_MODULES}  # pylint: disable=protected-access
  eager_from_lazy = [name for name in layers.__all__ if name not in layers._LAZY  # pylint: disable=protected-access
                     and getattr(getattr(layers, name), "__module__", None) in lazy_modules]
  assert not eager_from_lazy, f"imported eagerly from a lazy module: {eager_from_lazy}"


def test_bayesianize_replaces_every_flax_layer_with_a_bayesian_twin():
  for twin, classes in _flax_twins().items():
    replaced = BUILT_OF_TWINS.get(twin, twin)
    assert replaced in bayesianize._TWINS, (  # pylint: disable=protected-access
        f"bayesianize's _TWINS lacks {twin!r}, the flax twin of {classes[0].__name__}")
    flax_class, lookup = bayesianize._TWINS[replaced]  # pylint: disable=protected-access
    assert flax_class is getattr(nn, replaced)
    if replaced == twin:  # the lookup gives each Bayesian class and the twin's namesake
      assert [lookup(cls.estimator) for cls in classes] == classes
      assert lookup("deterministic") is LAYER_CLASSES[twin][1]


def test_bayesianize_reaches_attention_through_its_dense_general_projections():
  model = bayesianize.bayesianize(nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=4))
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 3, 4)))["params"]
  assert {name: sorted(p) for name, p in params.items()} == {
      name: ["bias", "kernel_loc", "kernel_scale"] for name in ("key", "out", "query", "value")}


def test_the_layers_page_names_every_layer():
  named = set(re.findall(r"`(\w+)`", LAYERS_PAGE.read_text()))
  assert [name for name in LAYER_CLASSES if name not in named] == []
