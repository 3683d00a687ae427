"""Imports that point one way: the library never imports the command line, and the
project's modules import each other without cycles.

The modules are read with ``ast``, not imported: every module of the installed package
``meshbayes`` (its subpackages mapped from the repository's top-level folders as
pyproject.toml's ``[tool.setuptools]`` says), each import resolved to the project module
it loads (relative imports included).

- The library (every module but the command-line entry points) imports neither
  ``meshbayes.launch`` nor ``meshbayes.tools``, at module level or in a function.
- The module-level imports (those run at import time: not in a function, not under
  ``if TYPE_CHECKING``) among the project's modules form no cycle; nor do they with the
  imports deferred into functions (a deferred import that closes a cycle hides a
  dependency pointing the wrong way).
- The layers point down: no module of the foundations (``layers/``, ``metrics/``,
  ``data/``, ``runtime/``) imports ``training/`` or a program, and the root holds the
  programs and a few shared modules only.
- No module imports another's private names (``from m import _name``).
- No test module imports another test module: shared helpers live in helper modules
  (``tests/conftest.py``, ``tests/training/runs.py``, ...).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "meshbayes"
# What the library must not import: the command line and the tools built on it.
COMMAND_LINE = ("meshbayes.launch", "meshbayes.tools")
# The programs, which may import the command line: meshbayes.launch itself, the commands of
# [project.scripts] and the `python -m` programs (each with a __main__ block), and every tool.
ENTRY_POINTS = ("meshbayes.launch", "meshbayes.train", "meshbayes.eval", "meshbayes.infer",
                "meshbayes.demo")
ENTRY_POINT_PACKAGES = ("meshbayes.tools", "meshbayes.examples")
# Packages every other part stands on, and what they must not import: training, and the
# programs (the entry points and meshbayes.configurables, which registers everything).
FOUNDATIONS = ("meshbayes.layers", "meshbayes.metrics", "meshbayes.data", "meshbayes.runtime")
ABOVE_FOUNDATIONS = ("meshbayes.training", "meshbayes.configurables", *ENTRY_POINTS,
                     *ENTRY_POINT_PACKAGES)
# The modules at the package's root: the programs and the few modules everything shares.
ROOT_MODULES = {"meshbayes", "meshbayes.configurables", "meshbayes.demo", "meshbayes.eval",
                "meshbayes.field_checks", "meshbayes.infer", "meshbayes.launch",
                "meshbayes.predictive", "meshbayes.train"}


# When an import statement runs.
AT_IMPORT, IN_FUNCTION, TYPE_CHECKING_ONLY = "at import", "in a function", "type checking"


class Import(NamedTuple):
  """A project module that ``importer`` imports, at ``line``, and when (``AT_IMPORT``,
  ``IN_FUNCTION`` or ``TYPE_CHECKING_ONLY``); ``names``: what ``from imported import
  ...`` takes from it (not its submodules)."""
  importer: str
  imported: str
  line: int
  when: str
  names: tuple[str, ...] = ()


def module_files(root: Path = ROOT) -> dict[str, Path]:
  """Every module of the installed package, by dotted name, from pyproject's mapping."""
  setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
  directories = setuptools.get("package-dir", {})
  modules = {}
  for package in setuptools["packages"]:
    mapped = max((p for p in directories if package == p or package.startswith(p + ".")),
                 key=len, default=None)
    folder = (root / directories[mapped] / package[len(mapped) + 1:].replace(".", "/")
              if mapped else root / package.replace(".", "/"))
    for path in sorted(folder.glob("*.py")):
      modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
  return modules


def _is_type_checking(test: ast.expr) -> bool:
  return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
          or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_nodes(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
  """Every import statement and when it runs: ``AT_IMPORT`` (a class body's too),
  ``IN_FUNCTION`` or ``TYPE_CHECKING_ONLY`` (under ``if TYPE_CHECKING``: never)."""
  def visit(node: ast.AST, when: str) -> Iterator:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node, when
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      for child in ast.iter_child_nodes(node):
        yield from visit(child, IN_FUNCTION if when == AT_IMPORT else when)
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
      for child in node.body:
        yield from visit(child, TYPE_CHECKING_ONLY)
      for child in node.orelse:
        yield from visit(child, when)
    else:
      for child in ast.iter_child_nodes(node):
        yield from visit(child, when)

  yield from visit(tree, AT_IMPORT)


def imports_of(name: str, source: str, known: set[str], is_package: bool = False
               ) -> list[Import]:
  """The project modules (``known``) that module ``name``'s ``source`` imports.

  ``from P import X`` loads the module ``P.X`` when there is one, else ``P`` itself;
  ``import P.Q`` loads ``P.Q``. Relative imports resolve against ``name``'s package
  (``name`` itself when ``is_package``: an ``__init__``).
  """
  package = name if is_package else name.rpartition(".")[0]
  found = []
  for node, when in _import_nodes(ast.parse(source)):
    targets: dict[str, list[str]] = {}  # module -> names taken from it
    if isinstance(node, ast.Import):
      for alias in node.names:
        targets.setdefault(alias.name, [])
    else:
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        if node.level - 1 >= len(parts):
          raise ValueError(f"{name}: relative import beyond the top-level package at line "
                           f"{node.lineno}")
        anchor = ".".join(parts[:len(parts) - (node.level - 1)])
        base = f"{anchor}.{base}" if base else anchor
      for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in known:
          targets.setdefault(submodule, [])
        else:
          targets.setdefault(base, []).append(alias.name)
    found += [Import(name, target, node.lineno, when, tuple(names))
              for target, names in targets.items() if target in known]
  return found


def project_imports(root: Path = ROOT) -> list[Import]:
  files = module_files(root)
  known = set(files)
  return [found for name, path in files.items()
          for found in imports_of(name, path.read_text(), known, path.stem == "__init__")]


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
  """One cycle (``[a, b, ..., a]``) through each strongly connected group of nodes of
  ``graph`` (node -> the nodes it points to) that has one, a self-loop included."""
  index, low, stack, on_stack, groups = {}, {}, [], set(), []

  def connect(node: str) -> None:  # Tarjan's algorithm
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for successor in sorted(graph.get(node, ())):
      if successor not in index:
        connect(successor)
        low[node] = min(low[node], low[successor])
      elif successor in on_stack:
        low[node] = min(low[node], index[successor])
    if low[node] == index[node]:
      group = set()
      while True:
        member = stack.pop()
        on_stack.discard(member)
        group.add(member)
        if member == node:
          break
      if len(group) > 1 or node in graph.get(node, ()):
        groups.append(group)

  for node in sorted(graph):
    if node not in index:
      connect(node)
  return [_cycle_in(group, graph) for group in groups]


def _cycle_in(group: set[str], graph: Mapping[str, set[str]]) -> list[str]:
  """A shortest cycle through the first node of a strongly connected ``group``."""
  start = min(group)
  paths = {start: [start]}
  frontier = [start]
  while frontier:
    following = []
    for node in frontier:
      for successor in sorted(graph.get(node, set()) & group):
        if successor == start:
          return [*paths[node], start]
        if successor not in paths:
          paths[successor] = [*paths[node], successor]
          following.append(successor)
    frontier = following
  raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def _is_entry_point(name: str) -> bool:
  return name in ENTRY_POINTS or any(name == p or name.startswith(p + ".")
                                     for p in ENTRY_POINT_PACKAGES)


def _has_main_block(path: Path) -> bool:
  return any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
             and "__main__" in ast.unparse(node.test)
             for node in ast.parse(path.read_text()).body)


# The project.


def test_the_library_does_not_import_the_command_line():
  offending = [f"{i.importer} imports {i.imported} (line {i.line}, {i.when})"
               for i in project_imports() if not _is_entry_point(i.importer)
               and any(i.imported == c or i.imported.startswith(c + ".") for c in COMMAND_LINE)]
  assert not offending, ("library modules import the command line (move what they share "
                         "into a library module): " + "; ".join(offending))


def test_the_entry_points_are_the_programs():
  """The exemptions above are the programs: every module run as a command (a __main__
  block or a [project.scripts] command) is exempt, and every module exempt by name but
  meshbayes.launch (the command lines' shared machinery) is run as a command; the
  packages exempt whole are the tools and the examples, with their helper modules."""
  files = module_files()
  scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
  commands = {target.split(":")[0] for target in scripts.values()}
  programs = {name for name, path in files.items() if _has_main_block(path)} | commands
  assert {n for n in programs if not _is_entry_point(n)} == set()
  assert set(ENTRY_POINTS) - programs == {"meshbayes.launch"} and set(ENTRY_POINTS) <= set(files)


@pytest.mark.parametrize("counted", [(AT_IMPORT,), (AT_IMPORT, IN_FUNCTION)],
                         ids=["module_level", "deferred_included"])
def test_imports_form_no_cycle(counted):
  graph: dict[str, set[str]] = {name: set() for name in module_files()}
  where = {}
  for found in project_imports():
    if found.when in counted:
      graph[found.importer].add(found.imported)
      where.setdefault((found.importer, found.imported), f"line {found.line}, {found.when}")
  cycles = find_cycles(graph)
  described = [" -> ".join(f"{a} ({where[a, b]})" for a, b in zip(cycle, cycle[1:]))
               + f" -> {cycle[-1]}" for cycle in cycles]
  assert not cycles, f"import cycles ({' or '.join(counted)}): " + "; ".join(described)


def _package(name: str) -> str:
  """The package of the project that holds module ``name`` (``meshbayes.training`` for
  ``meshbayes.training.trainer``); a module of the root is its own."""
  return ".".join(name.split(".")[:2])


@pytest.mark.parametrize("counted", [(AT_IMPORT,), (AT_IMPORT, IN_FUNCTION)],
                         ids=["module_level", "deferred_included"])
def test_packages_form_no_cycle(counted):
  """Modules may form no cycle and packages still may (training.trainer importing
  evaluation.teacher_forced while evaluation.driver imports training.checkpoint_restore):
  then neither package can be understood, tested or moved without the other."""
  graph: dict[str, set[str]] = {}
  where = {}
  for found in project_imports():
    importer, imported = _package(found.importer), _package(found.imported)
    if found.when in counted and importer != imported:
      graph.setdefault(importer, set()).add(imported)
      graph.setdefault(imported, set())
      where.setdefault((importer, imported), f"{found.importer} imports {found.imported}")
  cycles = find_cycles(graph)
  described = [" -> ".join(f"{a} ({where[a, b]})" for a, b in zip(cycle, cycle[1:]))
               + f" -> {cycle[-1]}" for cycle in cycles]
  assert not cycles, f"package cycles ({' or '.join(counted)}): " + "; ".join(described)


def _within(name: str, packages) -> bool:
  return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_foundations_import_neither_training_nor_the_programs():
  offending = [f"{i.importer} imports {i.imported} (line {i.line}, {i.when})"
               for i in project_imports() if _within(i.importer, FOUNDATIONS)
               and _within(i.imported, ABOVE_FOUNDATIONS)]
  assert not offending, ("a foundation package imports training or a program (move the "
                         "shared part down): " + "; ".join(offending))


def test_the_root_holds_the_programs_and_a_few_shared_modules():
  root = {name for name, path in module_files().items() if path.parent == ROOT / PACKAGE}
  assert root == ROOT_MODULES


def test_no_module_imports_anothers_private_names():
  offending = [f"{i.importer} imports {', '.join(private)} from {i.imported} (line {i.line})"
               for i in project_imports()
               if (private := [n for n in i.names if n.startswith("_") and not n.endswith("__")])]
  assert not offending, ("private names imported from another module (give what modules "
                         "share a public name in a module of its own): " + "; ".join(offending))


def test_no_test_module_imports_another():
  tests = ROOT / "tests"
  files = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
           for path in tests.rglob("*.py")}
  offending = [f"{found.importer} imports {found.imported} (line {found.line})"
               for name, path in files.items()
               for found in imports_of(name, path.read_text(), set(files),
                                       path.stem == "__init__")
               if found.imported.rpartition(".")[2].startswith("test_")]
  assert not offending, ("test modules import test modules (move the shared helpers to "
                         "tests/conftest.py or a helper module): " + "; ".join(offending))


# The checks themselves, on made-up modules.


def test_cycles_are_found_and_named():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"a"}}
  assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
  assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []


def test_imports_are_resolved_and_told_apart_by_when_they_run():
  known = {"p", "p.a", "p.b", "p.sub", "p.sub.c", "p.sub.d"}
  source = """
import os
from . import b
from .d import name
from .. import a
import p.sub.c as c
from p.sub import something_in_init
if TYPE_CHECKING:
  from p.sub import c
def f():
  from p import a
class K:
  from p import b
"""
  found = [(i.imported, i.line, i.when, i.names)
           for i in imports_of("p.sub.c", source, known)]
  assert found == [("p.sub", 3, AT_IMPORT, ("b",)), ("p.sub.d", 4, AT_IMPORT, ("name",)),
                   ("p.a", 5, AT_IMPORT, ()), ("p.sub.c", 6, AT_IMPORT, ()),
                   ("p.sub", 7, AT_IMPORT, ("something_in_init",)),
                   ("p.sub.c", 9, TYPE_CHECKING_ONLY, ()), ("p.a", 11, IN_FUNCTION, ()),
                   ("p.b", 13, AT_IMPORT, ())]
  # In a package's __init__, `.` is the package itself.
  assert [i.imported for i in imports_of("p.sub", "from . import c", known, True)] == ["p.sub.c"]


def test_the_old_path_of_teacher_forced_gives_the_moved_function_with_a_warning():
  from meshbayes.training import teacher_forced

  sys.modules.pop("meshbayes.evaluation.teacher_forced", None)  # it warns at first import
  with pytest.warns(DeprecationWarning, match="moved to meshbayes.training.teacher_forced"):
    from meshbayes.evaluation.teacher_forced import teacher_forced_metrics
  assert teacher_forced_metrics is teacher_forced.teacher_forced_metrics
