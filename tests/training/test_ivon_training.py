"""The trainer with IVON: exact resume, the posterior in evaluation and ``show``, and IVON
refused for a Bayesian-layer model."""

import json

import jax
import numpy as np
import pytest
from flax import traverse_util

from meshbayes import launch
from meshbayes.training import checkpoints
from meshbayes.data.pipeline import TaskData
from meshbayes.training.checkpoint_restore import restore_params
from meshbayes.layers import WeightPosterior
from meshbayes.models import EncoderDecoderModel, Estimators, TransformerConfig
from meshbayes.partitioning import Partitioner
from meshbayes.tools import inspect_checkpoint
from tests.training.runs import command, one_line, train, train_args

pytestmark = pytest.mark.integration

UNITS = 450000  # num_train_units of train_args: IVON's ess


def ivon_args(model_dir, steps, *bindings):
  return train_args(model_dir, steps, *bindings, kind="ivon")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  """8 IVON steps in one run."""
  model_dir = tmp_path_factory.mktemp("ivon") / "straight"
  try:
    launch.run("meshbayes.train", "train", ivon_args(
        model_dir, 8, "--gin.run_configs.EvaluationConfig.period=8"))
  except SystemExit as exit_:
    assert not exit_.code
  return model_dir


@pytest.mark.slow  # two more IVON runs (make test: the CLI resume, IVON's state through orbax)
def test_an_ivon_run_resumed_is_bit_identical_to_the_straight_run(straight, tmp_path, capsys):
  resumed = tmp_path / "resumed"
  assert train(capsys, *ivon_args(resumed, 4))[0] == 0
  code, out, err = train(capsys, *ivon_args(resumed, 8))
  assert code == 0, err[-2000:]
  assert "resuming from the checkpoint of step 4" in out
  a = checkpoints.read_arrays(checkpoints.find_step_dir(straight, 8))
  b = checkpoints.read_arrays(checkpoints.find_step_dir(resumed, 8))
  assert a.keys() == b.keys()
  assert {"opt_state/count", "opt_state/seed"} <= a.keys()
  assert any(k.startswith("opt_state/hessian/") for k in a)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  assert int(a["opt_state/count"]) == 8
  # The Hessian moved from hess_init, so the noise it scales is part of what resumed exactly.
  hessian = a["opt_state/hessian/encoder/layers/mlp/wi_0/kernel"]
  assert np.abs(hessian - 0.1).max() > 1e-6
  metrics = [json.loads(l) for l in (straight / "metrics.jsonl").read_text().splitlines()]
  assert metrics[-1]["posterior_stddev/mlp"] > 0


def test_the_posterior_of_an_ivon_checkpoint(straight, capsys):
  """Evaluation restores a WeightPosterior whose stddev is 1/sqrt(ess (h + wd)) of the
  saved Hessian; ``show`` prints its statistics per weight."""
  step_dir = checkpoints.find_step_dir(straight, 8)
  meta = checkpoints.read_meta(step_dir)
  assert meta["ivon"] == {"ess": UNITS, "weight_decay": 1e-4}
  config = TransformerConfig(vocab_size=32, emb_dim=32, num_heads=2, head_dim=16,
                             num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64,
                             dropout_rate=0.0, estimators=Estimators.deterministic())
  model = EncoderDecoderModel(config, num_train_units=UNITS)
  data = TaskData(task="synthetic_reverse", feature_lengths={"inputs": 16, "targets": 16},
                  batch_size=8)
  posterior, step = restore_params(straight, model, data, Partitioner())
  assert step == 8 and isinstance(posterior, WeightPosterior)
  saved = checkpoints.read_arrays(step_dir)
  name = "encoder/layers/mlp/wo/kernel"
  expected = 1.0 / np.sqrt(UNITS * (saved[f"opt_state/hessian/{name}"] + 1e-4))
  got = posterior.stddev["encoder"]["layers"]["mlp"]["wo"]["kernel"]
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  np.testing.assert_array_equal(posterior.mean["encoder"]["layers"]["mlp"]["wo"]["kernel"],
                                saved[f"params/{name}"])
  # Every weight's, bit for bit as the restore has always computed it (jit, float32 rsqrt).
  hessian = {k[len("opt_state/hessian/"):]: v for k, v in saved.items()
             if k.startswith("opt_state/hessian/")}
  stddev = jax.jit(lambda h: jax.tree.map(lambda x: jax.lax.rsqrt(UNITS * (x + 1e-4)), h))(
      hessian)
  restored = traverse_util.flatten_dict(posterior.stddev, sep="/")
  assert restored.keys() == hessian.keys()
  for weight, value in restored.items():
    np.testing.assert_array_equal(value, stddev[weight], err_msg=weight)
    np.testing.assert_array_equal(traverse_util.flatten_dict(posterior.mean, sep="/")[weight],
                                  saved[f"params/{weight}"], err_msg=weight)
  # The evaluation's convergence diagnostic: the median stddev of each layer group.
  evaluation = json.loads((straight / "eval" / "metrics.jsonl").read_text().splitlines()[-1])
  mlp = [np.ravel(1.0 / np.sqrt(UNITS * (saved[k] + 1e-4))) for k in sorted(saved)
         if k.startswith("opt_state/hessian/encoder/layers/mlp/")]
  assert evaluation["step"] == 8
  np.testing.assert_allclose(evaluation["posterior_stddev_median/encoder/mlp"],
                             np.median(np.concatenate(mlp)), rtol=1e-5)
  assert {k for k in evaluation if k.startswith("posterior_stddev_median/")} == {
      f"posterior_stddev_median/{g}" for g in ("encoder/attention", "encoder/mlp",
                                               "decoder/self_attention",
                                               "decoder/encoder_decoder_attention",
                                               "decoder/mlp", "token_embedder",
                                               # norms (and the decoder's logits)
                                               "encoder", "decoder")}

  assert inspect_checkpoint.main(["show", str(straight)]) == 0
  shown = capsys.readouterr().out
  assert "IVON: 1/sqrt(ess * (hessian + weight_decay))" in shown
  stddev_table = shown.split("IVON: 1/sqrt(ess * (hessian + weight_decay))")[1]
  row = next(line.split() for line in stddev_table.splitlines() if line.startswith(name + " "))
  assert float(row[1]) == pytest.approx(expected.mean(), rel=1e-3)


def test_evaluating_an_ivon_run_reports_its_model_average_and_posterior_mean(straight, capsys):
  code, _, err = command(
      capsys, "evaluate", "--gin_file=models/tiny.gin", "--gin_file=models/deterministic.gin",
      "--gin_file=runs/eval.gin",
      "--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{straight}'", "--gin.BATCH_SIZE=16",
      f"--gin.models.EncoderDecoderModel.num_train_units={UNITS}",
      "--gin.evaluation.DecodeConfig.enabled=False",
      "--gin.evaluation.PredictiveConfig.num_samples=2", "--gin.data.TaskData.max_eval_batches=1",
      "--gin.evaluation.ReportConfig.bootstrap_resamples=50")
  assert code == 0, err[-2000:]
  metrics = json.loads((straight / "eval" / "synthetic_reverse" / "metrics.json").read_text())
  assert metrics["predictives"] == ["model_average", "posterior_mean"]
  average = metrics["token_calibration"]["model_average"]
  mean = metrics["token_calibration"]["posterior_mean"]
  assert average["nll"] != mean["nll"]  # the samples differ from the mean
  assert abs(average["nll"] - mean["nll"]) < 0.5  # ... by the narrow posterior's little


def test_ivon_with_bayesian_layers_is_one_line_before_any_work(tmp_path, capsys):
  model_dir = tmp_path / "run"
  code, _, err = train(capsys, *train_args(model_dir, 4, "--gin.optimizers.Optimizer.name='ivon'"))
  assert code == 1
  assert "learns a posterior over a deterministic model's weights" in one_line(err)
  assert not model_dir.exists()
