"""tools/bench.py (meshbayes.scaling.benchmarks, trainer_benchmarks) at toy sizes: every
section runs and reports consistent figures."""

import json

import pytest

from meshbayes.layers import estimators
from meshbayes.scaling.ablations import NOISE_ABLATIONS
from meshbayes.tools import bench
from meshbayes.training import ivon


@pytest.mark.integration
@pytest.mark.slow  # every section compiles and times several programs: minutes on 2 cores
def test_every_section_reports_its_ratios(tmp_path):
  out = tmp_path / "bench.json"
  report = bench.main(["--rounds=1", "--step_model=tiny", "--step_batch=2", "--step_length=8",
                       "--step_rounds=2", "--step_ivon_ablations", "--step_noise_ablations",
                       "--rows=16", "--in_features=32", "--out_features=64",
                       "--prng_impls=default", "--no-jax_noise", "--pipeline_seconds=0.3",
                       "--pipeline_tasks=synthetic_reverse", "--decode_samples=2",
                       "--decode_length=4", "--decode_batch=4", "--resume_task=synthetic_reverse",
                       "--resume_step=20", "--trainer_models=tiny", "--trainer_steps=3",
                       f"--json={out}"])
  assert json.loads(out.read_text()) == json.loads(json.dumps(report))
  step = report["step"]
  assert step["efficiency_quotient"] == step["time_ratio"] / step["flop_ratio"]
  assert step["flops"]["bayesian"]["matmul"] > step["flops"]["deterministic"]["matmul"] > 0
  # Ratios from the traced FLOPs, which without remat the CPU's compiled matmuls equal.
  assert step["flop_ratio"] == (step["flops"]["bayesian"]["traced_matmul"]
                                / step["flops"]["deterministic"]["traced_matmul"])
  assert step["hlo_matmul_flop_ratio"] == pytest.approx(step["flop_ratio"], rel=1e-6)
  assert step["mfu"] == "n/a on CPU" and step["tflops_per_second"]["deterministic"] > 0
  # IVON's step: AdamW's matmuls on the same model (the noise and updates are elementwise).
  assert step["flops"]["ivon"]["matmul"] == step["flops"]["deterministic"]["matmul"]
  assert step["ivon_time_ratio"] == step["seconds"]["ivon"] / step["seconds"]["deterministic"]
  # The ablations take work out of IVON's program, and only while it is traced.
  assert step["flops"]["ivon_without_noise"]["all"] < step["flops"]["ivon"]["all"]
  assert step["flops"]["ivon_without_stddev_metrics"]["all"] < step["flops"]["ivon"]["all"]
  assert set(step) >= {"ivon_without_noise_time_ratio", "ivon_without_stddev_metrics_time_ratio"}
  assert ivon.IVON.noise.__name__ == "noise"
  # Stored noise: the variance's matmul is not done again; keeping the variance: neither.
  matmuls = {name: step["flops"][name]["traced_matmul"] for name in NOISE_ABLATIONS}
  assert matmuls["bayesian_storing_noise"] < step["flops"]["bayesian"]["traced_matmul"]
  assert matmuls["bayesian_keeping_variance"] == matmuls["bayesian_storing_noise"]
  for name in ("regenerating_time_ratio", "keeping_variance_time_ratio"):
    assert 0 < step[name]["low"] <= step[name]["estimate"] <= step[name]["high"]
  assert estimators.DENSE["flipout"].__wrapped__ is estimators.flipout
  layers = report["layers"]["default"]
  # The compiled programs' matmul floors: one extra matmul per Flipout / LR layer.
  assert abs(layers["matmul_flop_ratio"]["flipout"] - 2.0) < 0.01
  assert abs(layers["matmul_flop_ratio"]["local_reparameterization"] - 2.0) < 0.01
  assert abs(layers["matmul_flop_ratio"]["reparameterization"] - 1.0) < 0.01
  # With their noise stored, the estimators as written: no matmul is done again.
  for name, ratio in (("flipout", 2.0), ("local_reparameterization", 2.0),
                      ("reparameterization", 1.0)):
    assert abs(layers["matmul_flop_ratio"][f"{name} (noise stored)"] - ratio) < 0.01
    assert layers["seconds"][f"{name} (noise stored)"] > 0
  # The floor adds each estimator's draw alone to its matmul ratio.
  for name, seconds in layers["noise_seconds"].items():
    assert layers["floor"][name] == pytest.approx(
        layers["matmul_flop_ratio"][name] + seconds / layers["seconds"]["deterministic"])
  assert "flipout noise alone" not in layers["seconds"]
  pipeline = report["pipeline"]["synthetic_reverse"]
  assert pipeline["ratio"] > 0 and pipeline["train_steps_per_second"] > 0
  assert set(report["decode"]["slowdown_vs_posterior_mean"]) == {"S=2", "S=2, regenerated"}
  trainer = report["trainer"]["tiny"]
  assert trainer["overhead"] == trainer["seconds"]["trainer"] / trainer["seconds"]["bare"] - 1
  assert min(trainer["seconds"].values()) > 0
  assert trainer["input_share"] == trainer["input_seconds"] / trainer["seconds"]["bare"]
  resume = report["resume"]
  # Every method reaches the same batch 20; the restored state's size is seqio's shuffle buffer.
  assert resume["same_first_batch"] and resume["step"] == 20
  assert set(resume["seconds_to_first_step"]) == {"restored_state", "skip_tf_data",
                                                  "skip_fallback"}
  assert 10_000 < resume["input_state_bytes"] < 10_000_000


def test_unknown_sections_and_tasks_are_one_line_errors(capsys):
  for flag, message in (("--sections=steps", "unknown"), ("--pipeline_tasks=wmt", "unknown"),
                        ("--resume_task=wmt", "unknown"),
                        ("--trainer_steps=1,2,3", "one count per --trainer_models"),
                        ("--step_target=cpu:1",
                         "--step_target: target 'cpu:1': name a GPU (h100:N, h200:N)"),
                        ("--step_target=x100:1", "--step_target: ")):
    with pytest.raises(SystemExit):
      bench.parse_args([flag])
    assert message in capsys.readouterr().err
