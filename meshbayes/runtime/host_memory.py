"""malloc settings for the CPU runtime's per-step buffers.

``MESHBAYES_MALLOC`` (``huge_pages``, the default; ``reuse``; ``default``)
chooses glibc tunables, and ``exec_with_malloc_tunables`` applies them by
executing the program again before jax starts its runtime; tunables the user set
are kept. Why, and the measurements: docs/performance.md ("Host memory").
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

HUGE_PAGES = "glibc.malloc.hugetlb"
REUSE = (("glibc.malloc.arena_max", "1"), ("glibc.malloc.mmap_max", "0"),
         ("glibc.malloc.trim_threshold", str(2 ** 40)))
SETTING = "MESHBAYES_MALLOC"
SETTINGS = ("huge_pages", "reuse", "default")
_THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_FIRST_GLIBC = (2, 35)  # the first glibc with the huge-page tunable


def transparent_huge_page_mode(path: Path = _THP_MODE_FILE) -> str | None:
  """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None."""
  try:
    text = path.read_text()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def _glibc_version(libc: tuple[str, str]) -> tuple[int, ...] | None:
  name, version = libc
  try:
    return tuple(int(part) for part in version.split(".")[:2]) if name == "glibc" else None
  except ValueError:
    return None


def malloc_tunables(environ: Mapping[str, str], thp_mode: str | None,
                    libc: tuple[str, str]) -> str | None:
  """The ``GLIBC_TUNABLES`` value for ``environ``'s ``MESHBAYES_MALLOC``, or None to change nothing.

  Nothing changes without glibc 2.35 or later, or once the huge-page tunable
  is set (by an earlier call, or by the user); ``huge_pages`` changes nothing
  outside the ``madvise`` mode (``always`` needs no asking, ``never`` refuses).
  Tunables already set keep their values.

  Args:
    environ: the process environment.
    thp_mode: ``transparent_huge_page_mode()``.
    libc: ``platform.libc_ver()``, e.g. ``("glibc", "2.36")``.

  Raises:
    ValueError: ``MESHBAYES_MALLOC`` is not one of ``SETTINGS``.
  """
  setting = environ.get(SETTING, SETTINGS[0])
  if setting not in SETTINGS:
    raise ValueError(f"{SETTING}={setting!r} must be one of {', '.join(SETTINGS)}")
  version = _glibc_version(libc)
  if version is None or version < _FIRST_GLIBC or setting == "default":
    return None
  if setting == "huge_pages" and thp_mode != "madvise":
    return None
  tunables = [item for item in environ.get("GLIBC_TUNABLES", "").split(":") if item]
  names = {item.split("=")[0] for item in tunables}
  if HUGE_PAGES in names:
    return None
  wanted = (*(REUSE if setting == "reuse" else ()),
            (HUGE_PAGES, "1" if thp_mode == "madvise" else "0"))
  return ":".join(tunables + [f"{name}={value}" for name, value in wanted if name not in names])


def exec_with_malloc_tunables() -> None:
  """Executes this program again with ``malloc_tunables``, when they change anything.

  Call it first thing in a program's entry point, never in a library function:
  it replaces the process (same pid, same command line). Where
  ``malloc_tunables`` changes nothing it returns, so the program executed
  again goes on.
  """
  try:
    tunables = malloc_tunables(os.environ, transparent_huge_page_mode(), platform.libc_ver())
  except ValueError as error:
    argv = sys.orig_argv
    prog = argv[argv.index("-m") + 1] if "-m" in argv else Path(sys.argv[0]).name
    sys.exit(f"{prog}: error: {error}")
  if tunables is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": tunables})


def malloc_settings() -> dict[str, str]:
  """This process's glibc malloc tunables (for reports: what a measurement ran with)."""
  items = [item.split("=", 1) for item in os.environ.get("GLIBC_TUNABLES", "").split(":")]
  return {item[0]: item[1] for item in items if len(item) == 2 and item[0].startswith("glibc.malloc.")}
