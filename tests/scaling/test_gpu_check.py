"""tools/gpu_check.py and meshbayes.scaling.gpu_check: its arguments and plans, both frozen
models' predictions beside a measured step, attention alone, the merge of a preset's
processes, and toy runs on the CPU with every part of their JSON (XLA's attention in place
of cuDNN's, which a CPU lacks)."""

import gzip
import json
import pathlib

import pytest

from meshbayes.scaling import attention_alone, roofline
from meshbayes.scaling import gpu_check as check
from meshbayes.tools import gpu_check
from tests.scaling.gpu_hlo_texts import fused_attention_hlo

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
  assert ("| paper_no_remat | deterministic | 0.1000 | 0.1100 | -9.0% | - | - | 20.0% | - | - "
          "| 5.0 |") in table
  assert ("| paper_no_remat | bayesian | 0.2500 | 0.2000 | +25.0% | - | - | 16.0% | - | - "
          "| 9.0 |") in table
  on_cpu = check.summary({"tiny": {**det, "peak_bytes_in_use": {"deterministic": None}}})
  assert "| tiny | deterministic | 0.1000 | 0.1100 | -9.0% | - | - | 20.0% | - | - | - |" \
      in on_cpu
  assert "| tiny | bayesian |" not in on_cpu  # a kind the process did not run


def test_both_models_beside_a_step_with_fused_attention():
  # Paper's measured attention shape: v2 charges the measured 0.973 ms, v1 0.256 ms + 4 us.
  text = fused_attention_hlo(8, 128, 256, 128)
  flops = 7 * 2 * 8 * 128 * 256 * 256 * 128
  v1 = check.frozen_prediction(text, "NVIDIA H200", 8, 256, flops)
  v2 = check.frozen_prediction(text, "NVIDIA H200", 8, 256, flops, roofline.FROZEN_GPU_MODEL_V2)
  assert v1["seconds"] == pytest.approx(flops / (0.475 * 989e12) + 2 * 2e-6)
  assert v1["attention_seconds"] is None and v1["fused_attention_calls"] == 2
  assert v2["seconds"] == pytest.approx(0.973e-3) and v2["attention_seconds"] == v2["seconds"]
  assert v2["mfu"] == pytest.approx(flops / (0.973e-3 * 989e12))
  table = check.summary({"paper_gpu": {
      "seconds": {"deterministic": 1.0e-3}, "mfu": {"deterministic": 0.1},
      "predicted": {"deterministic": {**v1, "measured_error": 1.0e-3 / v1["seconds"] - 1}},
      "predicted_v2": {"deterministic": {**v2, "measured_error": 1.0e-3 / v2["seconds"] - 1}},
      "errors": {}}})
  assert "| paper_gpu | deterministic | 0.0010 | 0.0003 | +284.6% | 0.0010 | +2.8% | 10.0% " \
         "| 46.8% | 12.5% | - |" in table


def test_cudnn_attention_runs_as_xla_where_there_is_no_cudnn():
  assert check.runnable_overrides(check.GPU_SHAPE, "gpu") == (check.GPU_SHAPE, None)
  overrides, replaced = check.runnable_overrides(check.GPU_SHAPE, "cpu")
  assert dict(overrides) == {"scan_layers": False, "attention_dropout_rate": 0.0,
                             "attention_kernel": "xla"}
  assert replaced == "attention_kernel='cudnn' ran as 'xla': no cuDNN on cpu"
  assert check.runnable_overrides((), "cpu") == ((), None)


def test_the_v2_plan_measures_a_fused_attention_step_first():
  args = gpu_check.parse_args(["--out=x.json", "--plan=v2"])
  items = gpu_check.plan_items(args)
  assert items[0] == ("step", "base_gpu", ("deterministic",))
  assert check.STEP_PRESETS["base_gpu"].overrides == check.GPU_SHAPE
  assert dict(check.STEP_PRESETS["base_gpu_xla"].overrides)["attention_kernel"] == "xla"
  assert items[1] == ("attention", ("paper", "base", "base_gpu", "paper_gpu"))
  assert [i[1:] for i in items[2:]] == [("base_gpu_xla", ("deterministic",)),
                                        ("base_gpu", ("bayesian",)),
                                        ("paper_gpu32", ("deterministic",)),
                                        ("paper_gpu", ("bayesian",))]
  assert (args.train_steps, args.max_seconds) == (0, 480.0)
  toy = gpu_check.parse_args(["--out=x.json", "--plan=v2", "--toy"])
  assert [i[0] for i in gpu_check.plan_items(toy)] == ["step", "attention", "step"]
  assert toy.max_seconds == 0.0  # no limit at toy size
  # Without a plan, each preset's kinds as before.
  assert gpu_check.plan_items(gpu_check.parse_args(["--out=x.json", "--presets=base"])) == [
      ("step", "base", ("deterministic", "bayesian"))]


def test_plan_arguments_are_checked(capsys):
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--plan=v3"])
  assert "argument --plan: invalid choice: 'v3'" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--max_seconds=-1"])
  assert "--max_seconds=-1: give 0 (no limit) or more" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    gpu_check.parse_args(["--out=x.json", "--toy", "--attention_only=paper"])
  assert "--attention_only: unknown paper; choose from tiny" in capsys.readouterr().err


def test_attention_alone_at_toy_size_on_cpu():
  shape = attention_alone.TOY_SHAPES["tiny"]
  report = attention_alone.attention_section({"tiny": shape}, rounds=2)
  entry = report["shapes"]["tiny"]
  assert entry["implementation"] == "xla" and entry["fused_calls"] == 0
  assert entry["flops"] == 7 * 2 * 4 * 2 * 16 * 16 * 8
  # XLA's attention as compiled for the CPU: five of the seven matmuls a fused call counts.
  assert entry["hlo_matmul_flops"] == 5 * 2 * 4 * 2 * 16 * 16 * 8
  assert entry["seconds"] > 0 and entry["flops_per_second"] == entry["flops"] / entry["seconds"]
  assert entry["v2_seconds"].startswith("n/a: the v2 model's rates are for h100, h200")
  table = check.summary({}, report)
  assert "| tiny (4 x 16, 2 heads of 8) | xla |" in table


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


@pytest.mark.slow  # three processes, each compiling: minutes on two busy cores
def test_toy_v2_plan_on_cpu_writes_each_part(tmp_path):
  out = tmp_path / "plan.json"
  gpu_check.main(["--toy", "--plan=v2", f"--out={out}", "--rounds=2"])
  report = json.loads(out.read_text())
  assert report["plan"] == "v2" and "train" not in report
  step = report["step"]["tiny_gpu"]
  assert step["errors"] == {} and set(step["seconds"]) == {"deterministic", "bayesian"}
  assert step["replaced"] == "attention_kernel='cudnn' ran as 'xla': no cuDNN on cpu"
  assert "n/a" in step["predicted_v2"]["deterministic"]["error"]
  assert step["efficiency_quotient"] > 0  # the two kinds' processes, merged
  assert report["attention"]["shapes"]["tiny"]["implementation"] == "xla"
  assert report["ok"] is True
  assert "| tiny_gpu | bayesian |" in report["summary"] and "| tiny (4 x 16" in report["summary"]
