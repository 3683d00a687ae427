"""The old path of ``meshbayes.training.teacher_forced`` (moved so that training imports
nothing of evaluation); it goes in the next release. Each name is the new module's, with
a ``DeprecationWarning``, as JAX and flax retire names."""

import warnings
from typing import Any

from meshbayes.training import teacher_forced as _moved


def __getattr__(name: str) -> Any:
  if name.startswith("_") or not hasattr(_moved, name):  # tools probing module attributes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  warnings.warn(f"meshbayes.evaluation.teacher_forced.{name} moved to "
                f"meshbayes.training.teacher_forced.{name}; the old path goes in the next "
                "release", DeprecationWarning, stacklevel=2)
  return getattr(_moved, name)
