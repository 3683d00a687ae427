"""tools/gpu_model_check.py's command line: which frozen model it checks (``--model``), on
which steps (every measured H200 step) and code (each step's own commit unless
``--commit``); the compiles themselves are tests/scaling/test_gpu_aot.py's."""

import importlib.util
import json
import pathlib
import sys

import pytest

from meshbayes.scaling import frozen_model_check, roofline, targets
from meshbayes.scaling.measured_steps import MEASURED_H200_STEPS

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "gpu_model_check.py"


@pytest.fixture
def tool():
  """The tool's file loaded as a module of its own (as ``python tools/gpu_model_check.py``)."""
  spec = importlib.util.spec_from_file_location("tool_gpu_model_check", TOOL)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  yield module
  del sys.modules[spec.name]


def test_help_names_the_model_and_the_commit_default(tool, capsys):
  with pytest.raises(SystemExit) as done:
    tool.parse_args(["--help"])
  assert done.value.code == 0
  out = " ".join(capsys.readouterr().out.split())
  assert "--model {v1,v2}" in out
  assert "(default: each step's own measured commit)" in out


def test_the_arguments_default_to_v1_every_measured_step_and_their_own_commits(
    tool, monkeypatch, capsys):
  monkeypatch.setattr(targets, "gpu_aot_available", lambda: True)
  args = tool.parse_args(["--json=report.json"])
  assert (args.model, args.commit) == ("v1", None)
  assert args.steps == list(MEASURED_H200_STEPS)
  assert args.steps[-1].name == "paper_det_unrolled_16"
  args = tool.parse_args(["--json=r.json", "--model=v2", "--commit=56c213e",
                          "--steps=paper_det_unrolled_16"])
  assert (args.model, args.commit) == ("v2", "56c213e")
  assert [s.commit for s in args.steps] == ["b53958b"]
  with pytest.raises(SystemExit) as done:
    tool.parse_args(["--json=r.json", "--model=v3"])
  assert done.value.code == 2
  [line] = capsys.readouterr().err.splitlines()[-1:]
  assert "error: argument --model: invalid choice: 'v3'" in line


def test_main_checks_the_chosen_model_on_each_steps_own_commit(tool, monkeypatch, tmp_path,
                                                              capsys):
  monkeypatch.setattr(targets, "gpu_aot_available", lambda: True)
  calls = []

  def check(steps, commit, repository, script, **kwargs):
    calls.append((steps, commit, kwargs["model"]))
    return {"commit": sorted({s.commit for s in steps}), "steps": [], "ok": True}

  monkeypatch.setattr(frozen_model_check, "check", check)
  report = tool.main([f"--json={tmp_path / 'check.json'}", "--model=v2"])
  [(steps, commit, model)] = calls
  assert steps == list(MEASURED_H200_STEPS) and commit is None
  assert model is roofline.FROZEN_GPU_MODEL_V2
  assert report["model_name"] == "v2" and report["commit"] == ["56c213e", "b53958b"]
  assert json.loads((tmp_path / "check.json").read_text())["model_name"] == "v2"
  assert capsys.readouterr().out.startswith("frozen model v2\n")
  tool.main([f"--json={tmp_path / 'check.json'}"])
  assert calls[-1][2] is roofline.FROZEN_GPU_MODEL
