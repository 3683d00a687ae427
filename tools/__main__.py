"""The tools: ``python -m meshbayes.tools`` lists each with its one-line description;
``python -m meshbayes.tools NAME ARGS...`` runs ``python -m meshbayes.tools.NAME ARGS...``.

The list is this folder's modules (private ones, ``_*``, left out), each described by the
first sentence of its docstring, read without importing it (no jax, no TensorFlow).
"""

from __future__ import annotations

import ast
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def commands() -> dict[str, str]:
  """Each tool's name and the first sentence of its docstring, by name."""
  found = {}
  for path in sorted(FOLDER.glob("*.py")):
    if not path.stem.startswith("_"):
      doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
      paragraph = " ".join(doc.strip().split("\n\n")[0].split())
      sentence = paragraph.split(". ")[0]
      found[path.stem] = sentence if sentence.endswith((".", "?", "!")) else sentence + "."
  return found


def usage() -> str:
  """The list of commands, as ``python -m meshbayes.tools`` prints it."""
  listed = commands()
  width = max(map(len, listed))
  return "\n".join(["usage: python -m meshbayes.tools NAME [ARGS...]  (NAME --help: its usage)",
                    "", "commands:", *(f"  {name:<{width}}  {line}"
                                       for name, line in listed.items())]) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
  """Lists the commands (no NAME, ``-h``, ``--help``), or runs NAME with the rest."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(usage(), end="")
    return
  name, *rest = argv
  if name not in commands():
    sys.stderr.write(f"meshbayes.tools: error: no tool {name!r}; choose from "
                     f"{', '.join(commands())}\n")
    raise SystemExit(2)
  sys.argv = [f"meshbayes.tools.{name}", *rest]
  runpy.run_module(f"meshbayes.tools.{name}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
