"""The README is a short front door and every Python example in it and in docs/ runs.

Each ```python block of README.md, docs/*.md and the dated results pages
docs/results/*.md runs as written, from the repository root (some read files
under docs/); every relative markdown link of those pages points at a file that
exists. The README links every docs/*.md page; a docs page links every results page.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RESULTS = sorted((ROOT / "docs" / "results").glob("*.md"))
PAGES = [README, *DOCS, *RESULTS]
MAX_README_LINES = 250

_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
# [text](target), not images' or inline code's; the target up to a space or ')'.
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def _name(page: Path) -> str:
  return page.relative_to(ROOT).as_posix()


def _blocks() -> list[tuple[str, str]]:
  return [(f"{_name(page)}#{index}", code) for page in PAGES
          for index, code in enumerate(_PYTHON_BLOCK.findall(page.read_text()))]


BLOCKS = _blocks()


def _relative_links(page: Path) -> list[str]:
  text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE)
  return [target for target in _LINK.findall(text)
          if not re.match(r"[a-z][a-z0-9+.-]*:|#", target)]  # not http:, mailto:, #anchor


def test_the_readme_has_examples():
  assert len([name for name, _ in BLOCKS if name.startswith("README.md#")]) >= 1
  assert len(BLOCKS) >= 4


def test_the_readme_is_a_front_door():
  lines = len(README.read_text().splitlines())
  assert lines <= MAX_README_LINES, f"README.md has {lines} lines; at most {MAX_README_LINES}"


def _make_target(target: str) -> str:
  """The README's bullet of ``make TARGET`` under "`make` targets", joined into one line."""
  bullet = re.search(rf"^- `make {target}`:(.*?)(?=^- |^## )", README.read_text(),
                     flags=re.DOTALL | re.MULTILINE)
  assert bullet, f"README.md has no bullet for make {target}"
  return " ".join(bullet.group(1).split())


def test_the_readme_times_make_data_and_says_whether_make_demo_s_time_includes_it():
  """A new user's make demo prepares the data first: both times are given, and make demo's
  says whether it counts make data (issue 65)."""
  assert re.search(r"about (half a minute|\d+ (seconds|minutes?))", _make_target("data"))
  demo = _make_target("demo")
  assert re.search(r"about \d+ minutes", demo)
  assert re.search(r"(excludes|includes) `make data`", demo), demo
  # The first lines' time, too.
  first = README.read_text().split("## ")[0]
  assert "make demo" in first and "(make data)" in first


def test_the_readme_maps_every_docs_page():
  readme = README.read_text()
  missing = [_name(page) for page in DOCS if f"]({_name(page)})" not in readme]
  assert not missing, f"README.md links no line to {missing}"


def test_the_docs_link_every_results_page():
  """A results page is reached from a docs page (performance.md links its own)."""
  assert RESULTS
  linked = {(page.parent / target.split("#")[0]).resolve()
            for page in DOCS for target in _relative_links(page)}
  missing = [_name(page) for page in RESULTS if page.resolve() not in linked]
  assert not missing, f"no docs/*.md page links {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page):
  broken = [target for target in _relative_links(page)
            if not (page.parent / target.split("#")[0]).exists()]
  assert not broken, f"{_name(page)}: links to missing files {broken}"


def test_the_link_check_sees_links():
  assert "docs/layers.md" in _relative_links(README)
  assert not (ROOT / "docs" / "docs/layers.md").exists()  # from docs/, repo paths need ../


@pytest.mark.parametrize("name,code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_python_example_runs(name, code, monkeypatch):
  monkeypatch.chdir(ROOT)
  exec(compile(code, name, "exec"), {"__name__": name})
