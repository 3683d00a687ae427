"""The import paths of modules that moved (``meshbayes.trainer`` is now
``meshbayes.training.trainer``): each still imports, until release ``REMOVED_IN``, with
one ``DeprecationWarning`` naming its new path.

The old name is the new module itself (``meshbayes.console is meshbayes.runtime.console``),
not a copy, so a patch through the old path reaches the code that uses the module.
``docs/releases.md`` lists the old paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# The release that drops the old paths.
REMOVED_IN = "0.2.0"

# Old module (its path under meshbayes) -> its new home.
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
    # Moved so that training imports nothing of evaluation.
    "evaluation.teacher_forced": "training.teacher_forced",
}


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds ``meshbayes.<old>`` and puts the new module in its place."""

  def find_spec(self, fullname, path=None, target=None):
    package, _, old = fullname.partition(".")
    if package == "meshbayes" and old in MOVED:
      return importlib.util.spec_from_loader(fullname, self)
    return None

  def create_module(self, spec):
    return None  # a placeholder that exec_module replaces

  def exec_module(self, module: types.ModuleType) -> None:
    new_name = f"meshbayes.{MOVED[module.__name__.partition('.')[2]]}"
    # stacklevel 2: the importing line (warnings skips importlib's frames).
    warnings.warn(f"{module.__name__} moved to {new_name}; the old path goes in the next "
                  f"release ({REMOVED_IN})", DeprecationWarning, stacklevel=2)
    # Importlib hands back what sys.modules holds under the name after exec_module (and
    # binds it on the parent package): the new module itself.
    sys.modules[module.__name__] = importlib.import_module(new_name)


def install() -> None:
  """Lets the old paths import (once per process)."""
  if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
    sys.meta_path.append(_OldPathFinder())
