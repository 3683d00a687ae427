"""Strict JSON (issue 65): what the project writes has no bare ``NaN`` or ``Infinity``.

- ``meshbayes.runtime.strict_json``: non-finite numbers as null, each null's path and
  reason beside them, numpy values as JSON numbers, ``loads_strict`` refusing the bare
  constants; finite data written as ``json.dumps`` writes it (hashes of it unchanged).
- The source (``meshbayes/``, ``tools/``, ``models/``, ``partitioning/``) writes JSON only
  through ``strict_json``: every ``json.dump``/``json.dumps`` call passes
  ``allow_nan=False`` (``strict_json.py`` itself excepted).
- The writers: the nulls a strict file lists are NaN again where the project reads its own
  files back (``experiments.plan.read_json``, a run's ``metrics.jsonl``, the PlaNet tool's
  runs); a scaling study's records and the examples' JSON say why a figure is null.
"""

from __future__ import annotations

import ast
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from meshbayes.examples import lenet_digits
from meshbayes.runtime import strict_json
from meshbayes.experiments import plan as experiment_plan

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("meshbayes", "tools", "models", "partitioning")
# Modules allowed to call json.dump(s) without allow_nan=False, each with its reason.
EXCEPTIONS = {
    "meshbayes/runtime/strict_json.py": "the strict writer itself (it passes allow_nan=False "
                                        "after replacing every non-finite number)",
}
PLANET_RUNS = ROOT / "docs" / "planet" / "2026-11-28" / "runs"


# strict_json


def test_nested_non_finite_numbers_are_null_with_their_paths():
  tree = {"a": {"b": [1.0, np.float32("nan"), np.array([[0.5, np.inf], [-np.inf, 2.0]])]},
          "count": np.int64(3), "pair": (np.float64(1.5), True), "name": "x", "none": None}
  assert strict_json.dumps(tree, null_reasons="why") == (
      '{"a": {"b": [1.0, null, [[0.5, null], [null, 2.0]]]}, "count": 3, "pair": [1.5, true], '
      '"name": "x", "none": null, "why": {"a/b/1": "nan: undefined on these items", '
      '"a/b/2/0/1": "inf: not a finite number", "a/b/2/1/0": "-inf: not a finite number"}}')
  # Without null_reasons, or with nothing to explain, no key is added.
  assert strict_json.dumps({"x": -math.inf}) == '{"x": null}'
  assert strict_json.dumps({"x": 1.0}, null_reasons="why") == '{"x": 1.0}'
  # A list at the top has no place for reasons: its nulls stay bare.
  assert strict_json.dumps([math.nan, 2], null_reasons="why") == "[null, 2]"
  # A numpy scalar or array at the top.
  assert strict_json.dumps(np.float64(np.nan)) == "null"
  assert strict_json.dumps(np.arange(3) / 2) == "[0.0, 0.5, 1.0]"


def test_explain_gets_each_path_and_value():
  seen = []

  def explain(path, value):
    seen.append((path, value))
    return f"{value}: at {path}"

  text = strict_json.dumps({"rows": [{"p": math.inf}]}, null_reasons="why", explain=explain)
  assert json.loads(text) == {"rows": [{"p": None}], "why": {"rows/0/p": "inf: at rows/0/p"}}
  assert seen == [("rows/0/p", math.inf)]


def test_finite_data_is_written_as_json_writes_it():
  tree = {"s": [1, 2.5, 1e-300, True, None, "é"], 3: (0.1, [{"k": -0.0}]), "big": 10**20}
  for kwargs in ({}, {"indent": 1}):
    assert strict_json.dumps(tree, null_reasons="why", **kwargs) == json.dumps(tree, **kwargs)
  assert strict_json.dumps({"b": 1.0, "a": [2]}, sort_keys=True) == '{"a": [2], "b": 1.0}'


def test_loads_strict_refuses_the_bare_constants():
  assert strict_json.loads_strict('{"a": null, "b": [1.5]}') == {"a": None, "b": [1.5]}
  for constant in ("NaN", "Infinity", "-Infinity"):
    with pytest.raises(ValueError, match=f"non-standard JSON constant {constant}"):
      strict_json.loads_strict(f'{{"a": [1, {constant}]}}')
  written = strict_json.dumps({"x": [math.nan, math.inf]}, null_reasons="why")
  assert strict_json.loads_strict(written)["x"] == [None, None]


# The source writes JSON only through strict_json.


def _unchecked_json_writes(path: Path) -> list[int]:
  """Lines of ``path`` that call ``json.dump``/``json.dumps`` (under any import name)
  without ``allow_nan=False``."""
  tree = ast.parse(path.read_text(), str(path))
  modules, functions = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      modules |= {a.asname or a.name for a in node.names if a.name == "json"}
    elif isinstance(node, ast.ImportFrom) and node.module == "json":
      functions |= {a.asname or a.name for a in node.names if a.name in ("dump", "dumps")}
  lines = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    func = node.func
    writes = ((isinstance(func, ast.Attribute) and func.attr in ("dump", "dumps")
               and isinstance(func.value, ast.Name) and func.value.id in modules)
              or (isinstance(func, ast.Name) and func.id in functions))
    strict = any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant)
                 and k.value.value is False for k in node.keywords)
    if writes and not strict:
      lines.append(node.lineno)
  return lines


def test_the_checker_finds_every_way_of_calling_json(tmp_path):
  module = tmp_path / "m.py"
  module.write_text("import json\nimport json as j\nfrom json import dumps as d, dump\n"
                    "json.dumps(1)\nj.dump(1, f)\nd(1)\ndump(1, f, allow_nan=True)\n"
                    "json.dumps(1, allow_nan=False)\nstrict_json.dumps(1)\njson.loads('1')\n")
  assert _unchecked_json_writes(module) == [4, 5, 6, 7]


def test_the_source_writes_json_only_strictly():
  found = {}
  for folder in SOURCE_FOLDERS:
    for path in sorted((ROOT / folder).rglob("*.py")):
      name = path.relative_to(ROOT).as_posix()
      if name not in EXCEPTIONS and (lines := _unchecked_json_writes(path)):
        found[name] = lines
  assert not found, ("json.dump(s) without allow_nan=False (bare NaN/Infinity): use "
                     f"meshbayes.runtime.strict_json.dumps; found {found}")


# Read back: as before strict JSON.


def test_read_json_gets_the_non_finite_figures_back(tmp_path):
  path = tmp_path / "report.json"
  value = {"p_value": math.nan, "bins": [1.0, math.inf], "a/b": {"c": -math.inf}, "n": None}
  experiment_plan.write_json(path, value)
  written = strict_json.loads_strict(path.read_text())
  assert written["null_reasons"] == {"p_value": "nan: undefined on these items",
                                     "bins/1": "inf: not a finite number",
                                     "a/b/c": "-inf: not a finite number"}
  read = experiment_plan.read_json(path)
  assert set(read) == {"p_value", "bins", "a/b", "n"}  # the reasons gone, as before
  assert math.isnan(read["p_value"]) and read["bins"] == [1.0, math.inf]
  assert read["a/b"] == {"c": -math.inf} and read["n"] is None  # a null of its own stays


def test_a_run_history_with_a_null_nll_reads_as_nan(tmp_path):
  # metrics.jsonl as the trainer writes it (one strict line per evaluation): a NaN NLL.
  group = experiment_plan.MEDIAN_PREFIX + "encoder/mlp"
  lines = [strict_json.dumps({"step": step, "nll": nll, group: stddev},
                             null_reasons=strict_json.NULL_REASONS)
           for step, nll, stddev in ((2, 3.0, 0.1), (4, math.nan, 0.2))]
  (tmp_path / "eval").mkdir()
  (tmp_path / "eval" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  assert '"nll": null' in lines[1]
  converged = experiment_plan.convergence(tmp_path)
  assert converged["step"] == 4 and math.isnan(converged["nll"])
  assert converged["groups"]["encoder/mlp"]["median"] == 0.2


def test_a_scaling_study_record_says_why_its_figure_is_null():
  from meshbayes.tools import scaling_study  # pylint: disable=import-outside-toplevel

  records = [{"target": "v2:2x2", "mfu": 0.5}, {"target": "cpu:4", "mfu": math.inf}]
  assert scaling_study.records_text(records[:1]) == json.dumps(records[:1], indent=1)
  assert strict_json.loads_strict(scaling_study.records_text(records)) == [
      {"target": "v2:2x2", "mfu": 0.5},
      {"target": "cpu:4", "mfu": None, "null_reasons": {"mfu": "inf: not a finite number"}}]


def test_the_examples_json_says_why_a_figure_is_null(tmp_path):
  # Ten classes: no confidence below 0.1, the first reliability bin empty (its means NaN).
  rng = np.random.default_rng(0)
  log_probs = lambda: np.log(rng.dirichlet(np.ones(10), size=(2, 50)))
  metrics, _ = lenet_digits.evaluate(log_probs(), rng.integers(0, 10, 50), log_probs())
  assert metrics["reliability"]["bin_count"][0] == 0
  assert math.isnan(metrics["reliability"]["bin_accuracy"][0])
  lenet_digits.write_json(str(tmp_path / "lenet_digits.json"), {"flipout": metrics})
  saved = strict_json.loads_strict((tmp_path / "lenet_digits.json").read_text())
  reliability = saved["flipout"]["reliability"]
  assert reliability["bin_accuracy"][0] is None and reliability["bin_confidence"][0] is None
  assert saved["null_reasons"]["flipout/reliability/bin_accuracy/0"] == (
      "nan: an empty bin (no test digit's confidence in it)")
  empty = [i for i, count in enumerate(reliability["bin_count"]) if count == 0]
  assert sorted(saved["null_reasons"]) == sorted(
      f"flipout/reliability/{name}/{i}" for name in ("bin_accuracy", "bin_confidence")
      for i in empty)


@pytest.mark.integration
def test_planet_resumes_a_run_with_a_null_figure_as_nan(tmp_path, capsys):
  """The published runs of the cpu preset, reused (nothing trains); one with its probe R^2
  null as a strict file of a NaN has it."""
  from meshbayes.tools import planet  # pylint: disable=import-outside-toplevel

  runs = tmp_path / "runs"
  runs.mkdir()
  for estimator in ("deterministic", "reparameterization"):
    shutil.copy(PLANET_RUNS / f"{estimator}_seed0.json", runs)
  record = json.loads((runs / "reparameterization_seed0.json").read_text())
  record["velocity_probe_r2"] = math.nan
  (runs / "reparameterization_seed0.json").write_text(strict_json.dumps(
      record, null_reasons=strict_json.NULL_REASONS))
  # The published runs' initial stddev ratio (the cpu preset's before the remedy).
  summary = planet.main(["--preset=cpu", "--seeds=1", "--transition_stddev_ratio=0.1",
                         f"--out={tmp_path}"])
  printed = capsys.readouterr().out
  assert "reparameterization seed 0: held-out return" in printed
  assert "round" not in printed  # reused, not trained
  assert math.isnan(summary["agents"]["reparameterization"]["velocity_probe_r2"][0])
  written = strict_json.loads_strict((tmp_path / "planet.json").read_text())
  assert written["agents"]["reparameterization"]["velocity_probe_r2"] == [None]
  assert written["null_reasons"]["agents/reparameterization/velocity_probe_r2/0"] == (
      strict_json.NAN_REASON)
  assert written["comparisons"]["reparameterization"]["velocity_probe_r2"]["estimate"] is None
