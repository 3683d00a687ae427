"""tools/gpu_check.py: its arguments, and a toy run on the CPU with every part of its JSON."""

import json

import pytest

from meshbayes.tools import gpu_check


def test_arguments_refuse_odd_steps_and_unknown_presets(capsys):
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--train_steps=7"])
  assert "--train_steps=7: give an even number >= 2" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--toy", "--presets=base"])
  assert "--presets: unknown base; choose from tiny" in capsys.readouterr().err
  args = gpu_check.parse_args(["--out=x.json"])
  assert args.presets == ["base", "paper"] and args.train_steps == 50


@pytest.mark.slow  # about 7 minutes on two busy cores (compiles), a minute on a free CPU
def test_toy_run_on_cpu_writes_every_part(tmp_path):
  out = tmp_path / "check.json"
  gpu_check.main(["--toy", f"--out={out}", "--rounds=2"])
  report = json.loads(out.read_text())
  assert report["ok"] is True and report["toy"] is True
  step = report["step"]["tiny"]
  assert step["errors"] == {} and set(step["seconds"]) == {"deterministic", "bayesian"}
  assert step["flops"]["bayesian"]["traced_matmul"] > step["flops"]["deterministic"]["traced_matmul"]
  assert step["mfu"] == "n/a on CPU" and step["efficiency_quotient"] > 0
  assert report["train"]["first"]["checkpoint_steps"] == [4]
  assert report["train"]["resumed"]["checkpoint_steps"] == [4, 8]  # resumed from 4, saved 8
  assert report["eval"]["metrics"]["task"] == "synthetic_reverse"
  assert len(report["infer"]["outputs"]) == 3
