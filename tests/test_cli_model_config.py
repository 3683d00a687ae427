"""eval and infer configure the model as the training run did (``MODEL_DIR/config.gin``),
and the command line overrides it."""

import json

import pytest

from meshbayes import launch
from meshbayes.runtime import gin_preflight
from tests.training.runs import train_args

pytestmark = pytest.mark.integration

# What eval needs besides the run: no model preset (models/*.gin).
EVAL_ARGS = ["--gin_file=runs/eval.gin", "--gin_file=tasks/synthetic.gin", "--gin.BATCH_SIZE=8",
             "--gin.models.EncoderDecoderModel.num_train_units=450000",
             "--gin.evaluation.DecodeConfig.enabled=False",
             "--gin.data.TaskData.max_eval_batches=1"]


def command(capsys, prog, entry_point, args):
  """Runs a command here as its module does: (exit status, stdout, stderr)."""
  try:
    launch.run(f"meshbayes.{prog}", entry_point, args,
               model_from_model_dir=entry_point != "train")
    code = 0
  except SystemExit as exit_:
    code = exit_.code
  out, err = capsys.readouterr()
  return code, out, err


@pytest.fixture(scope="module")
def deterministic_run(tmp_path_factory):
  """A tiny deterministic model trained for 2 steps."""
  model_dir = tmp_path_factory.mktemp("deterministic") / "run"
  try:
    launch.run("meshbayes.train", "train", train_args(model_dir, 2, kind="deterministic"))
  except SystemExit as exit_:
    pytest.fail(f"training failed with {exit_.code}")
  return model_dir


def test_the_model_bindings_of_a_training_config(deterministic_run):
  text = gin_preflight.model_bindings((deterministic_run / "config.gin").read_text())
  names = {line.split(" = ")[0] for line in text.splitlines()
           if " = " in line and not line.startswith("#")}
  assert names == {
      "MODEL", "LOSS_NORMALIZATION", "EncoderDecoderModel.config",
      "EncoderDecoderModel.loss_normalization", "EncoderDecoderModel.num_train_units",
      *(f"Estimators.{c}" for c in ("attention", "cross_attention", "embedding", "logits",
                                     "mlp")),
      *(f"TransformerConfig.{p}" for p in ("dropout_rate", "emb_dim", "estimators", "head_dim",
                                           "mlp_dim", "num_decoder_layers",
                                           "num_encoder_layers", "num_heads", "vocab_size"))}
  assert "Estimators.mlp = 'deterministic'" in text
  assert text.startswith("import meshbayes.data\n")
  assert gin_preflight.model_bindings("train.seed = 1\nBATCH_SIZE = 8\n") == ""


def test_eval_evaluates_the_trained_model_without_its_preset(deterministic_run, capsys):
  model_dir = f"--gin.MODEL_DIR='{deterministic_run}'"
  code, out, err = command(capsys, "eval", "evaluate", [*EVAL_ARGS, model_dir])
  assert code == 0, err[-3000:]
  assert (f"meshbayes.eval: the model is configured as in {deterministic_run}/config.gin; "
          "--gin_file and --gin. bindings override it") in out.splitlines()
  metrics = json.loads((deterministic_run / "eval" / "synthetic_reverse" / "metrics.json")
                       .read_text())
  # A Bayesian model (the default estimators) would add the model average of 4 samples.
  assert metrics["step"] == 2 and metrics["predictives"] == ["posterior_mean"]

  # The command line overrides the training run's model: this one does not fit the checkpoint.
  code, _, err = command(capsys, "eval", "evaluate",
                         [*EVAL_ARGS, model_dir, "--gin.models.TransformerConfig.mlp_dim=48"])
  assert code == 1 and "does not fit this model" in err
  assert "the model needs (2, 32, 48)" in err


def test_without_config_gin_the_model_comes_from_the_command_line_alone(deterministic_run,
                                                                        tmp_path, capsys):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "checkpoints").symlink_to(deterministic_run / "checkpoints")
  code, out, err = command(capsys, "eval", "evaluate",
                           [*EVAL_ARGS, f"--gin.MODEL_DIR='{tmp_path / 'run'}'"])
  assert code == 1 and "config.gin" not in out
  assert ("meshbayes.eval: error: gin macro MODEL is used but not set; add the gin file that "
          "sets it or --gin.MODEL=VALUE (traceback in ") in err


def test_infer_reads_it_too(deterministic_run, tmp_path, capsys):
  """gin builds infer's model from it before infer runs and stops at the absent input file
  (decoding itself is tested with a preset in tests/evaluation/test_inference.py)."""
  code, out, err = command(capsys, "infer", "infer", [
      "--gin_file=runs/infer.gin", "--gin_file=tasks/synthetic.gin", "--gin.BATCH_SIZE=8",
      f"--gin.MODEL_DIR='{deterministic_run}'", f"--gin.INPUT_FILE='{tmp_path / 'in.txt'}'",
      f"--gin.OUTPUT_FILE='{tmp_path / 'out.txt'}'"])
  assert f"meshbayes.infer: the model is configured as in {deterministic_run}/config.gin" in out
  assert code == 1 and "in.txt' does not exist" in err
