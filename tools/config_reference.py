"""Write the reference of every gin-configurable setting (``docs/configuration.md``).

  python -m meshbayes.tools.config_reference [--output=docs/configuration.md]

Run from the repository root. Generated from the code, so it cannot drift
(``tests/tools/test_config_reference.py`` fails when the committed file is out of
date): every configurable that ``meshbayes.configurables`` and
``meshbayes.launch`` register, each parameter with its type, default and the
description from the docstring's ``Args:`` or ``Attributes:`` section; and
the macros the presets in ``gin_configs/`` define, with their files.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gin
from gin import config_parser

DEFAULT_OUTPUT = Path("docs") / "configuration.md"
COMMAND = "python -m meshbayes.tools.config_reference"
_SECTIONS = ("Args:", "Arguments:", "Attributes:")


@dataclasses.dataclass(frozen=True)
class Parameter:
  """One configurable parameter: ``name``, ``type`` and ``default`` as written in the
  code (``default`` None when required), and its docstring ``description``."""

  name: str
  type: str
  default: str | None
  description: str


@dataclasses.dataclass(frozen=True)
class Configurable:
  """A registered configurable: the ``name`` gin files use, the Python object's
  ``target`` path, its docstring ``summary`` and its ``parameters``."""

  name: str
  target: str
  summary: str
  parameters: tuple[Parameter, ...]


def _registered() -> Iterator[Any]:
  """gin's registered configurables. gin has no public way to list them; this is the
  only place that reads its private registry."""
  return (c for _, c in gin.config._REGISTRY.items())  # pylint: disable=protected-access


def docstring_parameters(docstring: str) -> dict[str, str]:
  """``name -> description`` from the Google-style ``Args:``/``Attributes:`` sections of
  a (dedented) docstring, continuation lines joined into one line.

  >>> docstring_parameters('Summary.\\n\\nArgs:\\n  x: the x,\\n    long.\\n  y (int): why.')
  {'x': 'the x, long.', 'y': 'why.'}
  """
  descriptions: dict[str, list[str]] = {}
  section_indent, current = None, None
  for line in docstring.splitlines():
    indent, text = len(line) - len(line.lstrip()), line.strip()
    if text in _SECTIONS:
      section_indent, current = indent, None
    elif section_indent is None or not text:
      continue
    elif indent <= section_indent:
      section_indent, current = None, None
    else:
      entry = re.match(r"\*{0,2}(\w+)(?:\s*\([^)]*\))?:\s*(.*)", text)
      if entry and (current is None or indent <= current[1]):
        current = (entry.group(1), indent)
        descriptions[current[0]] = [entry.group(2)]
      elif current is not None:
        descriptions[current[0]].append(text)
  return {name: " ".join(w for w in words if w) for name, words in descriptions.items()}


def _summary(docstring: str) -> str:
  return " ".join(docstring.split("\n\n", 1)[0].split())


def _format_default(value: Any) -> str:
  if callable(value) and hasattr(value, "__qualname__"):
    return f"{value.__module__}.{value.__qualname__}"
  text = repr(value)
  if re.search(r" at 0x[0-9a-f]+", text):
    raise ValueError(f"config_reference: the default {text} changes from run to run; give its "
                     "type a __repr__")
  return text


def _defaults(target: Any) -> dict[str, str]:
  """Dataclass fields made by a ``default_factory``, whose signature shows ``<factory>``."""
  if not (inspect.isclass(target) and dataclasses.is_dataclass(target)):
    return {}
  return {f.name: _format_default(f.default_factory()) for f in dataclasses.fields(target)
          if f.default_factory is not dataclasses.MISSING}


def describe(configurable: Any) -> Configurable:
  """The reference of one of gin's registered configurables."""
  target = configurable.wrapped
  docstring = inspect.getdoc(target) or ""
  documented = docstring_parameters(docstring)
  factories = _defaults(target)
  parameters = []
  for parameter in inspect.signature(target).parameters.values():
    if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL) or (
        configurable.allowlist and parameter.name not in configurable.allowlist) or (
        configurable.denylist and parameter.name in configurable.denylist):
      continue
    annotation = parameter.annotation
    type_ = ("" if annotation is parameter.empty else
             annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))
    if parameter.kind == parameter.VAR_KEYWORD:
      default = "any other keyword"
    elif parameter.name in factories:
      default = factories[parameter.name]
    else:
      default = None if parameter.default is parameter.empty else _format_default(
          parameter.default)
    parameters.append(Parameter(parameter.name, type_, default,
                                documented.get(parameter.name, "")))
  # Registered without a module of its own (``train``), it is named by its name alone.
  explicit_module = configurable.module != getattr(target, "__module__", None)
  name = f"{configurable.module}.{configurable.name}" if explicit_module else configurable.name
  return Configurable(name, f"{target.__module__}.{target.__qualname__}", _summary(docstring),
                      tuple(parameters))


def configurables() -> list[Configurable]:
  """Every configurable meshbayes registers, sorted by name."""
  # pylint: disable=import-outside-toplevel,unused-import
  import meshbayes.configurables  # noqa: F401
  import meshbayes.launch  # noqa: F401  (registers distributed.DistributedOptions)
  found = [describe(c) for c in _registered()
           if getattr(c.wrapped, "__module__", "").startswith("meshbayes.")]
  return sorted(found, key=lambda c: c.name)


@dataclasses.dataclass(frozen=True)
class Macro:
  """A macro of the presets: ``definitions`` ``(file, value)`` (files relative to
  ``gin_configs/``) and the parameters the presets bind to it (``bound_to``)."""

  name: str
  definitions: tuple[tuple[str, str], ...]
  bound_to: tuple[str, ...]


def preset_macros(directory: Path) -> list[Macro]:
  """The macros the ``.gin`` files under ``directory`` define, sorted by name."""
  definitions: dict[str, list[tuple[str, str]]] = {}
  uses: dict[str, set[str]] = {}
  for path in sorted(directory.rglob("*.gin")):
    file = path.relative_to(directory).as_posix()
    statements = config_parser.ConfigParser(path.read_text(), gin.config.ParserDelegate(
        skip_unknown=True))
    for statement in statements:
      if not isinstance(statement, config_parser.BindingStatement):
        continue
      # repr: gin syntax (`'tokens'`, `%gin.REQUIRED`, `@models.EncoderDecoderModel()`).
      if not statement.arg_name:  # `NAME = value` defines a macro
        definitions.setdefault(statement.selector, []).append((file, repr(statement.value)))
      elif macro := re.fullmatch(r"%(\w+)", repr(statement.value)):
        uses.setdefault(macro.group(1), set()).add(f"{statement.selector}.{statement.arg_name}")
  return [Macro(name, tuple(found), tuple(sorted(uses.get(name, ()))))
          for name, found in sorted(definitions.items())]


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def _code(text: str) -> str:
  return f"`{_cell(text)}`" if text else ""


def render(configurables_: Sequence[Configurable], macros: Sequence[Macro]) -> str:
  """The markdown reference."""
  lines = [
      "# Configuration reference", "",
      f"Generated by `{COMMAND}` (from the repository root) from the code: the "
      "configurables `meshbayes.configurables` and `meshbayes.launch` register, and the "
      "macros of the presets in `gin_configs/`. Do not edit it by hand; "
      "`tests/tools/test_config_reference.py` fails when it is out of date.", "",
      "Bind a parameter in a gin file (`data.TaskData.batch_size = 64`) or on the command "
      "line (`--gin.data.TaskData.batch_size=64`); a macro likewise (`BATCH_SIZE = 64`, "
      "`--gin.BATCH_SIZE=64`). A parameter without a default must be bound; a macro set "
      "to `%gin.REQUIRED` must be set.", "",
      "## Configurables", ""]
  lines += [f"- [`{c.name}`](#{re.sub(r'[^a-z0-9_-]', '', c.name.lower())}): {c.summary}"
            for c in configurables_]
  for c in configurables_:
    lines += ["", f"### {c.name}", "", f"`{c.target}`: {c.summary}", ""]
    if not c.parameters:
      lines.append("No parameters.")
      continue
    lines += ["| parameter | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{p.name}` | {_code(p.type)} | "
              f"{'required' if p.default is None else _code(p.default)} | "
              f"{_cell(p.description)} |" for p in c.parameters]
  lines += ["", "## Macros of the presets", "",
            "Defined in `gin_configs/` (a file included later, or `--gin.NAME=VALUE`, "
            "overrides an earlier definition):", "",
            "| macro | bound to | defined in |", "|---|---|---|"]
  lines += [f"| `{m.name}` | {', '.join(_code(b) for b in m.bound_to)} | "
            + "<br>".join(f"{_code(file)}: {_code(value)}" for file, value in m.definitions)
            + " |" for m in macros]
  return "\n".join(lines) + "\n"


def generate() -> str:
  """The reference as the code defines it now."""
  from meshbayes.gin_configs import DIRECTORY  # pylint: disable=import-outside-toplevel
  return render(configurables(), preset_macros(Path(DIRECTORY)))


def main(argv: Sequence[str] | None = None) -> Path:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                      help=f"default: {DEFAULT_OUTPUT}")
  args = parser.parse_args(argv)
  print("config_reference: importing the configurables (the data layer loads TensorFlow)",
        flush=True)
  text = generate()
  args.output.parent.mkdir(parents=True, exist_ok=True)
  args.output.write_text(text)
  print(f"wrote {args.output} ({text.count(chr(10))} lines)")
  return args.output


if __name__ == "__main__":
  main()
