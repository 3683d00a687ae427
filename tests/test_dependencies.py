"""requirements.lock pins everything an install brings: the installed dependency closure of
meshbayes and its ``dev`` extra, each at the version the lock names, and pyproject's pins
agree with it."""

import importlib.metadata as metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _lock() -> dict[str, str]:
  pins = {}
  for line in (ROOT / "requirements.lock").read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
      name, version = re.fullmatch(r"([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==(\S+)", line).groups()
      pins[canonicalize_name(name)] = version
  return pins


def _closure(requirements: list[Requirement]) -> dict[str, str]:
  """The installed distributions ``requirements`` bring, transitively, with their versions
  (markers evaluated for this interpreter; each requirement's extras followed)."""
  found: dict[str, str] = {}
  todo = [(r, "") for r in requirements]
  while todo:
    requirement, extra = todo.pop()
    if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
      continue
    name = canonicalize_name(requirement.name)
    dist = metadata.distribution(name)
    for wanted in [""] * (name not in found) + sorted(requirement.extras):
      todo += [(Requirement(r), wanted) for r in dist.requires or ()]
    found[name] = dist.version
  return found


def test_the_lock_pins_every_installed_dependency_at_its_installed_version():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  direct = [Requirement(r) for r in
            project["dependencies"] + project["optional-dependencies"]["dev"]]
  lock = _lock()
  installed = _closure(direct)
  assert "narwhals" in installed  # scikit-learn's; once missing from the lock
  missing = sorted(set(installed) - set(lock))
  assert not missing, f"requirements.lock does not pin {missing}: add them as name==version"
  wrong = {name: (version, lock[name]) for name, version in installed.items()
           if version != lock[name]}
  assert not wrong, f"installed (version, locked version) differ: {wrong}"
  for requirement in direct:
    pinned = {s.version for s in requirement.specifier if s.operator == "=="}
    assert pinned == {lock[canonicalize_name(requirement.name)]}, requirement
