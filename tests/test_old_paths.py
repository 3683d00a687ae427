"""The old import paths of moved modules are the new modules themselves, not copies: a
patch through an old path reaches the code that uses the module, each old path warns once,
and docs/releases.md lists them all."""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

from meshbayes.runtime.old_paths import MOVED, REMOVED_IN

RELEASES = Path(__file__).resolve().parents[1] / "docs" / "releases.md"


def _unbind(name: str):
  """Removes module ``name``'s binding on its package (``meshbayes.console``); returns it."""
  package, _, last = name.rpartition(".")
  return vars(sys.modules[package]).pop(last, None) if package in sys.modules else None


@pytest.fixture
def not_yet_imported():
  """Forgets the old paths' modules, as a process that never imported them (their entries in
  sys.modules and on their packages, which `from meshbayes import console` reads); restores
  them."""
  saved = [(name, sys.modules.pop(name, None), _unbind(name))
           for name in (f"meshbayes.{old}" for old in MOVED)]
  yield
  for name, module, bound in saved:
    sys.modules.pop(name, None)
    _unbind(name)
    if module is not None:
      sys.modules[name] = module
    if bound is not None:
      package, _, last = name.rpartition(".")
      setattr(sys.modules[package], last, bound)


def _deprecations(caught) -> list[str]:
  return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.usefixtures("not_yet_imported")
@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_and_warns_once(old):
  new = importlib.import_module(f"meshbayes.{MOVED[old]}")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module(f"meshbayes.{old}")
    again = importlib.import_module(f"meshbayes.{old}")
  assert _deprecations(caught) == [
      f"meshbayes.{old} moved to meshbayes.{MOVED[old]}; the old path goes in the next "
      f"release ({REMOVED_IN})"]
  assert module is new and again is new and sys.modules[f"meshbayes.{old}"] is new
  parent, _, last = f"meshbayes.{old}".rpartition(".")
  assert getattr(sys.modules[parent], last) is new  # `meshbayes.console` as an attribute
  name = next(n for n in vars(new) if not n.startswith("_"))
  assert getattr(__import__(f"meshbayes.{old}", fromlist=[name]), name) is getattr(new, name)


@pytest.mark.usefixtures("not_yet_imported")
def test_a_patch_through_an_old_path_reaches_the_code_that_uses_the_module(monkeypatch):
  with pytest.warns(DeprecationWarning, match="meshbayes.host_memory moved to"):
    from meshbayes import host_memory as old_path
  from meshbayes.runtime import host_memory

  calls = []
  monkeypatch.setenv("MESHBAYES_MALLOC", "default")  # the real function would change nothing
  monkeypatch.setattr(old_path, "malloc_tunables", lambda *args: calls.append(args))
  host_memory.exec_with_malloc_tunables()  # looks malloc_tunables up in its module
  assert len(calls) == 1 and calls[0][0]["MESHBAYES_MALLOC"] == "default"


def test_the_release_notes_list_every_old_path_and_when_it_goes():
  notes = RELEASES.read_text()
  rows = dict(re.findall(r"^\| `meshbayes\.([\w.]+)` \| `meshbayes\.([\w.]+)` \|", notes,
                         flags=re.MULTILINE))
  assert rows == MOVED
  assert f"release {REMOVED_IN}" in notes
