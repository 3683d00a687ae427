"""tools/gpu_check.py and meshbayes.scaling.gpu_check: its arguments, the frozen model's
prediction beside a measured step, the merge of a preset's processes, and a toy run on the
CPU with every part of its JSON."""

import gzip
import json
import pathlib

import pytest

from meshbayes.scaling import gpu_check as check
from meshbayes.tools import gpu_check

H200 = pathlib.Path(__file__).parent / "data" / "h200"


def test_arguments_refuse_odd_steps_and_unknown_presets(capsys):
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--train_steps=7"])
  assert "--train_steps=7: give an even number >= 2" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--toy", "--presets=base"])
  assert "--presets: unknown base; choose from tiny" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--kinds=ivon"])
  assert "--kinds=ivon: choose from deterministic, bayesian" in capsys.readouterr().err
  args = gpu_check.parse_args(["--out=x.json"])
  assert args.presets == ["base", "paper", "paper_no_remat"] and args.train_steps == 50
  assert gpu_check.parse_args(["--out=x.json", "--train_steps=0"]).train_steps == 0
  # The Bayesian paper step without remat (about 123 GB) gets a process of its own.
  assert check.STEP_PRESETS["paper_no_remat"].separate


def test_the_frozen_models_prediction_beside_a_measured_step():
  text = gzip.decompress((H200 / "base_det_none.hlo.txt.gz").read_bytes()).decode()
  predicted = check.frozen_prediction(text, "NVIDIA H200", 32, 256, 1.1650e13)
  assert predicted["seconds"] == pytest.approx(0.0808, abs=5e-5)
  assert predicted["mfu"] == pytest.approx(1.1650e13 / (0.0808 * 989e12), rel=1e-3)
  assert predicted["kernels"] == 4781
  assert predicted["kernel_seconds"] == pytest.approx(4781 * 2e-6)
  assert "n/a" in check.frozen_prediction(text, "cpu", 32, 256, 1.0)["error"]


def test_a_preset_run_kind_by_kind_is_merged_into_one_report():
  det = {"seconds": {"deterministic": 0.1}, "flops": {"deterministic": {"traced_matmul": 1.0}},
         "predicted": {"deterministic": {"seconds": 0.11, "measured_error": -0.09}},
         "mfu": {"deterministic": 0.2}, "errors": {},
         "peak_bytes_in_use": {"deterministic": 5 * 2**30}}
  bayes = {"seconds": {"bayesian": 0.25}, "flops": {"bayesian": {"traced_matmul": 2.0}},
           "predicted": {"bayesian": {"seconds": 0.2, "measured_error": 0.25}},
           "mfu": {"bayesian": 0.16}, "errors": {}, "peak_bytes_in_use": {"bayesian": 9 * 2**30}}
  merged = check.merge([det, bayes])
  assert merged["seconds"] == {"deterministic": 0.1, "bayesian": 0.25}
  assert merged["time_ratio"] == pytest.approx(2.5)
  assert merged["efficiency_quotient"] == pytest.approx(1.25)
  assert merged["peak_bytes_in_use"] == {"deterministic": 5 * 2**30, "bayesian": 9 * 2**30}
  table = check.summary({"paper_no_remat": merged})
  assert "| paper_no_remat | deterministic | 0.1000 | 0.1100 | -9.0% | 20.0% | - | 5.0 |" in table
  assert "| paper_no_remat | bayesian | 0.2500 | 0.2000 | +25.0% | 16.0% | - | 9.0 |" in table
  on_cpu = check.summary({"tiny": {**det, "peak_bytes_in_use": {"deterministic": None}}})
  assert "| tiny | deterministic | 0.1000 | 0.1100 | -9.0% | 20.0% | - | - |" in on_cpu


@pytest.mark.slow  # about 7 minutes on two busy cores (compiles), a minute on a free CPU
def test_toy_run_on_cpu_writes_every_part(tmp_path):
  out = tmp_path / "check.json"
  gpu_check.main(["--toy", f"--out={out}", "--rounds=2"])
  report = json.loads(out.read_text())
  assert report["ok"] is True and report["toy"] is True
  step = report["step"]["tiny"]
  assert step["errors"] == {} and set(step["seconds"]) == {"deterministic", "bayesian"}
  assert "n/a" in step["predicted"]["bayesian"]["error"]  # no frozen model for a CPU
  assert "| tiny | bayesian |" in report["summary"]
  assert step["flops"]["bayesian"]["traced_matmul"] > step["flops"]["deterministic"]["traced_matmul"]
  assert step["mfu"] == "n/a on CPU" and step["efficiency_quotient"] > 0
  assert report["train"]["first"]["checkpoint_steps"] == [4]
  assert report["train"]["resumed"]["checkpoint_steps"] == [4, 8]  # resumed from 4, saved 8
  assert report["eval"]["metrics"]["task"] == "synthetic_reverse"
  assert len(report["infer"]["outputs"]) == 3
