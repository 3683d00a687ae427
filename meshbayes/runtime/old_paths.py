"""The import paths of modules that moved (``meshbayes.trainer`` is now
``meshbayes.training.trainer``): each still imports, for one release, with a
``DeprecationWarning`` naming its new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# Old module (under meshbayes) -> its new home.
MOVED = {
    **{name: f"training.{name}" for name in (
        "checkpoint_integrity", "checkpoint_restore", "checkpoints", "compute_log",
        "early_stopping", "host_input", "ivon", "optimizers", "posterior_diagnostics",
        "run_configs", "train_step", "trainer")},
    **{name: f"runtime.{name}" for name in (
        "atomic_files", "console", "distributed", "gin_preflight", "host_memory",
        "metrics_writer", "preemption", "run_lock")},
    "inference": "evaluation.inference",
    "laplace": "evaluation.laplace",
    "text_lines": "data.text_lines",
}


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds ``meshbayes.<old>`` and makes it the new module's stand-in."""

  def find_spec(self, fullname, path=None, target=None):
    package, _, name = fullname.rpartition(".")
    if package == "meshbayes" and name in MOVED:
      return importlib.util.spec_from_loader(fullname, self)
    return None

  def create_module(self, spec):
    return None  # a plain module, filled by exec_module

  def exec_module(self, module: types.ModuleType) -> None:
    new_name = f"meshbayes.{MOVED[module.__name__.rpartition('.')[2]]}"
    warnings.warn(f"{module.__name__} moved to {new_name}; the old path goes in the next "
                  "release", DeprecationWarning, stacklevel=2)
    new = importlib.import_module(new_name)
    module.__dict__.update({k: v for k, v in vars(new).items()
                            if k not in ("__name__", "__spec__", "__loader__", "__path__")})
    module.__getattr__ = lambda name: getattr(new, name)  # names the new module gains later


def install() -> None:
  """Lets the old paths import (once per process)."""
  if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
    sys.meta_path.append(_OldPathFinder())
