"""scaling.frozen_model_check without compiling: each step's own commit installed once, and
either frozen model's predictions against the measured seconds."""

import gzip
from pathlib import Path

import pytest

from meshbayes.scaling import frozen_model_check, roofline
from meshbayes.scaling.measured_steps import MeasuredStep
from tests.scaling.gpu_hlo_texts import fused_attention_hlo

FLOPS = 7 * 2 * 8 * 128 * 256 * 256 * 128  # paper's measured attention shape, as hlo counts it


def test_check_installs_each_commit_once_and_takes_the_model(monkeypatch, tmp_path):
  installed, compiled = [], []

  def install(commit, repository, folder):
    installed.append(commit)
    return Path(folder) / "site"

  def compile_step(step, site, hlo_path, options, script):
    compiled.append((step.name, site.parent.name))
    hlo_path.write_bytes(gzip.compress(fused_attention_hlo(8, 128, 256, 128).encode()))
    return {"compile_seconds": 1.0}

  monkeypatch.setattr(frozen_model_check, "install_commit", install)
  monkeypatch.setattr(frozen_model_check, "compile_step", compile_step)
  steps = [MeasuredStep(name, "paper", True, 8, 256, "none", 0.973e-3, FLOPS, commit=commit)
           for name, commit in (("a", "56c213e"), ("b", "b53958b"), ("c", "56c213e"))]
  report = frozen_model_check.check(steps, None, tmp_path, tmp_path / "script.py",
                                    model=roofline.FROZEN_GPU_MODEL_V2)
  assert installed == ["56c213e", "b53958b"]
  assert compiled == [("a", "56c213e"), ("b", "b53958b"), ("c", "56c213e")]
  assert report["commit"] == ["56c213e", "b53958b"] and report["ok"] is True
  assert report["model"]["fused_attention"][1]["seconds"] == 0.973e-3
  assert [r["predicted_seconds"] for r in report["steps"]] == [pytest.approx(0.973e-3)] * 3
  assert report["steps"][0]["attention_seconds"] == pytest.approx(0.973e-3)
  # One commit for all (the tool's --commit), and v1 by default: 73% short, not ok.
  installed.clear()
  report = frozen_model_check.check(steps, "56c213e", tmp_path, tmp_path / "script.py")
  assert installed == ["56c213e"] and report["ok"] is False
  assert report["steps"][0]["error"] == pytest.approx(
      (FLOPS / (0.475 * 989e12) + 4e-6) / 0.973e-3 - 1)
