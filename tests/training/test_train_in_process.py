"""The commands in this process: bad input, a non-finite loss, broken checkpoints, a failed
save, an old checkpoint, MOPED, evaluation and inference of a trained run; and that run resumed
in a new process."""

import errno
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from meshbayes.metrics import ood as ood_metrics
from meshbayes.training import checkpoints, compute_log
from meshbayes.tools import inspect_checkpoint
from tests.training.runs import (TOOLS, command, events, one_line, run, tool, train, train_args,
                                 train_or_fail)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("binding, message", [
    ("--gin.models.TransformerConfgi.emb_dim=8", "models.TransformerConfgi"),
    ("--gin.models.TransformerConfig.emb_dimz=8", "emb_dimz"),
    ("--gin.TRAIN_STEPS='ten'", "train: train_steps='ten' must be a positive int"),
    ("--gin.models.TransformerConfig.emb_dim='big'",
     "TransformerConfig: emb_dim='big' must be a positive int"),
    ("--gin.optimizers.Optimizer.name='lamb'", "Optimizer: name='lamb' must be one of"),
])
def test_bad_bindings_stop_before_any_work_with_one_line(tmp_path, capsys, binding, message):
  model_dir = tmp_path / "run"
  code, _, err = train(capsys, *train_args(model_dir, 4), binding)
  assert code == 1
  assert message in one_line(err)
  assert not model_dir.exists()


def test_missing_required_macro_and_bad_flags(tmp_path, capsys):
  args = [a for a in train_args(tmp_path / "run", 4) if not a.startswith("--gin.MODEL_DIR")]
  code, _, err = train(capsys, *args)
  assert code == 1 and "gin macro MODEL_DIR is %gin.REQUIRED but not set; set it with " \
                        "--gin.MODEL_DIR=VALUE" in one_line(err)
  code, _, err = train(capsys, "--gin_fil=x.gin")
  assert code == 2 and "unknown or incomplete flag '--gin_fil=x.gin'" in one_line(err)
  code, _, err = train(capsys, "--gin_file=no/such/file.gin")
  assert code == 1 and "no/such/file.gin" in one_line(err)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A Bayesian run of 8 steps (checkpoints at 4 and 8); tests work on copies."""
  model_dir = tmp_path_factory.mktemp("trained") / "run"
  train_or_fail(train_args(model_dir, 8))
  return model_dir


REQUIRED_METRICS = {"loss", "nll", "kl", "kl_weight", "neg_elbo", "accuracy", "learning_rate",
                    "gradient_norm", "posterior_stddev/attention", "posterior_stddev/mlp",
                    "tokens_per_second", "step_seconds"}


def test_resume_in_a_new_process_is_bit_identical_to_an_uninterrupted_run(trained, tmp_path):
  """The 8-step run's checkpoint of step 4, resumed to 8 by `python -m meshbayes.train`:
  the state of the uninterrupted run's step 8, optimizer state included."""
  resumed = tmp_path / "resumed"
  shutil.copytree(trained / "checkpoints" / "4", resumed / "checkpoints" / "4")
  # The cost of an attempt killed after its save at step 4, as it recorded it.
  (resumed / "compute.json").write_text(json.dumps([
      {"first_step": 0, "last_step": 4, "cpu_seconds": 10.0, "wall_seconds": 12.0}]))
  second = run("meshbayes.train", train_args(resumed, 8))
  assert second.returncode == 0, second.stderr[-2000:]
  assert "resuming from the checkpoint of step 4" in second.stdout
  assert ("opening the training input (1 shard(s) on this host), restoring its saved position"
          in second.stdout)
  assert "step 8/8 [" in second.stdout and "tok/s" in second.stdout

  diff = tool("inspect_checkpoint.py", "diff", trained, resumed, "--step", 8)
  assert diff.returncode == 0, diff.stdout[-3000:]
  assert diff.stdout.strip().endswith("identical")
  assert "opt_state" in diff.stdout  # optimizer state too

  # What a run leaves behind.
  assert (trained / "config.gin").read_text().count("train.train_steps") == 1
  lines = [json.loads(l) for l in (trained / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [2, 4, 6, 8]
  assert REQUIRED_METRICS <= set(lines[-1])
  assert list((trained / "train").glob("events.out.tfevents.*"))
  # Each attempt's cost up to its last save, the earlier ones kept: the run's total.
  [whole] = compute_log.read(trained)
  assert (whole.first_step, whole.last_step) == (0, 8) and 0 < whole.wall_seconds
  assert whole.cpu_seconds > 1  # imports and compilation included
  earlier, this = compute_log.read(resumed)
  assert (earlier.cpu_seconds, this.first_step, this.last_step) == (10.0, 4, 8)
  assert compute_log.total(resumed)["cpu_seconds"] == pytest.approx(10.0 + this.cpu_seconds)


@pytest.mark.slow  # an infinite loss; test_run_safety keeps the non-finite state in make test
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(trained, tmp_path, capsys):
  model_dir = tmp_path / "run"
  shutil.copytree(trained, model_dir)
  code, _, err = train(capsys, *train_args(model_dir, 12),
                       "--gin.models.EncoderDecoderModel.z_loss=1e999")  # an infinite loss
  assert code == 1
  assert ("non-finite parameters or optimizer state (loss inf) after step 9; training stopped "
          "without saving it; the last finite checkpoint is step 8 in "
          f"{model_dir / 'checkpoints'}") in one_line(err)
  assert checkpoints.find_step_dir(model_dir).name == "8"
  diff = subprocess.run([sys.executable, str(TOOLS / "inspect_checkpoint.py"), "diff",
                         str(trained), str(model_dir)], capture_output=True, text=True)
  assert diff.returncode == 0, diff.stdout[-2000:]


def test_verify_of_a_damaged_manifest_is_one_answer_and_nothing_else(trained, tmp_path):
  model_dir = tmp_path / "run"
  shutil.copytree(trained, model_dir)
  manifest = model_dir / "checkpoints" / "8" / "state" / "manifest.ocdbt"
  data = bytearray(manifest.read_bytes())
  data[len(data) // 2] ^= 0xFF
  manifest.write_bytes(bytes(data))
  for _ in range(3):  # the tracebacks of orbax's parallel reads came one run in two
    result = subprocess.run([sys.executable, str(TOOLS / "inspect_checkpoint.py"), "verify",
                             str(model_dir)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stderr == "", result.stderr[-2000:]
    assert (f"step        8  corrupt: checkpoint {model_dir / 'checkpoints' / '8'} is corrupt or "
            "incomplete: DATA_LOSS: Error decoding local file") in result.stdout
    assert "step        4  ok" in result.stdout


def test_corrupt_foreign_and_interrupted_checkpoints(trained, tmp_path, capsys):
  model_dir = tmp_path / "run"
  shutil.copytree(trained, model_dir)
  # An interrupted save leaves a temporary directory: ignored, the run resumes from step 8.
  (model_dir / "checkpoints" / "12.orbax-checkpoint-tmp-1700000000").mkdir()
  code, out, _ = train(capsys, *train_args(model_dir, 10))
  assert code == 0 and "resuming from the checkpoint of step 8" in out

  # Another model's checkpoint: named parameters that do not fit.
  code, _, err = train(capsys, *train_args(model_dir, 12),
                       "--gin.models.TransformerConfig.mlp_dim=48")
  line = one_line(err)
  assert code == 1 and "does not fit this model" in line
  assert "mlp/wi_0/kernel_loc has shape (2, 32, 64) float32, the model needs (2, 32, 48)" in line

  # A corrupt checkpoint: its array data is gone.
  for path in (model_dir / "checkpoints" / "10" / "state").rglob("*"):
    if path.is_file() and path.parent.name == "d":
      path.unlink()
  code, _, err = train(capsys, *train_args(model_dir, 12))
  line = one_line(err)
  assert code == 1 and "checkpoint" in line and "10 is corrupt or incomplete" in line
  assert ("to resume from the checkpoint before it (step 8), run again with "
          "--gin.run_configs.CheckpointConfig.fallback_on_corrupt=True") in line

  # A checkpoint whose metadata is gone fails before its arrays are read: the same way out.
  shutil.rmtree(model_dir / "checkpoints" / "10" / "meta")
  code, _, err = train(capsys, *train_args(model_dir, 12))
  line = one_line(err)
  assert code == 1 and "has no readable meta item" in line
  assert "(step 8), run again with --gin.run_configs.CheckpointConfig.fallback_on_corrupt" in line


def test_a_model_dir_that_is_a_file_is_one_line(tmp_path, capsys):
  model_dir = tmp_path / "run"
  model_dir.write_text("a file")
  code, _, err = train(capsys, *train_args(model_dir, 4))
  assert code == 1
  assert f"MODEL_DIR {model_dir} must be a directory, but {model_dir} is a file" in one_line(err)


@pytest.mark.slow  # trains and resumes; make test resumes in the CLI and IVON tests
def test_a_failed_save_is_one_line_and_the_last_good_checkpoint_resumes(trained, tmp_path,
                                                                         capsys, monkeypatch):
  model_dir = tmp_path / "run"
  shutil.copytree(trained, model_dir)

  async def full_disk(self, directory, args):  # the input item's write, in the background
    async def write():
      raise OSError(errno.ENOSPC, "No space left on device")
    return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="full_disk")]

  with monkeypatch.context() as patch:
    patch.setattr(checkpoints.InputStateHandler, "async_save", full_disk)
    # Saves at 12 (fails in the background, found when saving 16) and 16.
    code, _, err = train(capsys, *train_args(model_dir, 16))
  assert code == 1
  assert one_line(err).startswith(
      "meshbayes.train: error: checkpoint of step 12 could not be written (no space left on "
      f"device); the last good checkpoint is step 8 in {model_dir / 'checkpoints'}; free space "
      "and run again")
  assert "Traceback" not in err and "ERROR" not in err, err[-2000:]
  assert checkpoints.find_step_dir(model_dir).name == "8"

  # The final save failing: the run does not say it trained.
  final_fails = tmp_path / "final"
  shutil.copytree(trained, final_fails)
  with monkeypatch.context() as patch:
    patch.setattr(checkpoints.InputStateHandler, "async_save", full_disk)
    code, out, err = train(capsys, *train_args(final_fails, 12))
  assert code == 1 and "trained to step" not in out
  assert "checkpoint of step 12 could not be written" in one_line(err)

  # Run again as a user does, in a new process: in this one, orbax's threads may still
  # finish the failed step's temporary directory after the run has returned.
  again = run("meshbayes.train", train_args(model_dir, 16))
  assert again.returncode == 0, again.stderr[-2000:]
  assert "resuming from the checkpoint of step 8" in again.stdout
  assert checkpoints.find_step_dir(model_dir).name == "16"


@pytest.mark.slow  # checkpoints older than the saved input position; a resume each
def test_a_checkpoint_without_an_input_position_resumes_by_skipping(trained, tmp_path, capsys):
  """A checkpoint of the previous version (a batch count, no iterator state) resumes
  exactly, and says how."""
  model_dir = tmp_path / "run"
  shutil.copytree(trained / "checkpoints" / "4", model_dir / "checkpoints" / "4")
  shutil.rmtree(model_dir / "checkpoints" / "4" / "input")
  code, out, err = train(capsys, *train_args(model_dir, 8))
  assert code == 0, err[-2000:]
  said = [line for line in out.splitlines() if not line.startswith(("step 6/", "step 8/"))]
  expected = [re.escape(f"resuming from the checkpoint of step 4 in {model_dir / 'checkpoints'}"),
              r"opening the training input \(1 shard\(s\) on this host\), reading and dropping "
              r"the 4 batches consumed \(the checkpoint holds no input position for them\)\.\.\.",
              r"input at batch 4 after [\d.]+ s",
              r"compiling the train step \(step 5\)\.\.\.",
              r"step 5 took [\d.]+ s \(compilation included\); training",
              re.escape(f"trained to step 8: checkpoints in {model_dir / 'checkpoints'}, metrics "
                        f"in {model_dir / 'metrics.jsonl'} (TensorBoard: tensorboard --logdir "
                        f"{model_dir}, from the [tensorboard] extra: pip install -e "
                        "'.[tensorboard]')")]
  assert len(said) >= len(expected), out
  for line, pattern in zip(said[-len(expected):], expected):
    assert re.fullmatch(pattern, line), (line, pattern)
  text, identical = inspect_checkpoint.diff(str(trained), str(model_dir), 8)
  assert identical, text[-2000:]


@pytest.mark.slow  # trains a deterministic and a Bayesian model
def test_bayesian_start_from_a_deterministic_checkpoint_is_moped(tmp_path, capsys):
  deterministic = tmp_path / "deterministic"
  assert train(capsys, *train_args(deterministic, 4, kind="deterministic"))[0] == 0
  bayesian = tmp_path / "bayesian"
  code, out, err = train(capsys, *train_args(
      bayesian, 1, f"--gin.run_configs.CheckpointConfig.initial_checkpoint='{deterministic}'",
      "--gin.run_configs.CheckpointConfig.initial_from_deterministic=True",
      "--gin.run_configs.CheckpointConfig.moped_delta=0.1",
      # A vanishing learning rate: after one step the parameters are the initial ones.
      "--gin.optimizers.LearningRate.base=1e-30"))
  assert code == 0, err[-2000:]
  assert "initial posterior from the deterministic checkpoint" in out
  read = lambda d: checkpoints.read_arrays(checkpoints.find_step_dir(d))
  det, bay = read(deterministic), read(bayesian)
  name = "params/encoder/layers/mlp/wi_0/kernel"
  np.testing.assert_array_equal(bay[name + "_loc"], det[name])
  np.testing.assert_allclose(jax.nn.softplus(bay[name + "_scale"]),
                             np.maximum(0.1 * np.abs(det[name]), 1e-6), rtol=1e-4)
  # Deterministic parts (norms, embeddings) are copied.
  np.testing.assert_array_equal(bay["params/token_embedder/embedding"],
                                det["params/token_embedder/embedding"])


def test_eval_and_infer_cannot_give_wrong_answers_or_overwrite_their_input(
    trained, tmp_path, capsys):
  meta = checkpoints.read_meta(checkpoints.find_step_dir(trained))
  assert meta["task"] == "synthetic_reverse" and meta["num_train_units"] == 450000
  common = [f"--gin.MODEL_DIR='{trained}'", "--gin.BATCH_SIZE=64",
            "--gin_file=models/tiny.gin", "--gin_file=tasks/synthetic.gin"]
  # Another task with the run's vocabulary: evaluated (out of distribution) and said so;
  # the KL divisor is the run's D whatever the evaluated task's size.
  out_dir = tmp_path / "copy"
  code, out, err = command(capsys, "evaluate", "--gin_file=runs/eval.gin", *common,
                           "--gin.MIXTURE_OR_TASK_NAME='synthetic_copy'",
                           "--gin.models.EncoderDecoderModel.num_train_units=7",
                           "--gin.evaluation.DecodeConfig.enabled=False",
                           "--gin.data.TaskData.max_eval_batches=1",
                           f"--gin.evaluation.ReportConfig.output_dir='{out_dir}'")
  assert code == 0, err[-2000:]
  assert ("note: the run {} was trained on task 'synthetic_reverse'; evaluating it on "
          "'synthetic_copy' (the same vocabulary) is out-of-distribution").format(trained) in err
  assert out.endswith(f"results in {out_dir} (metrics.json: every figure and its interval)\n")
  metrics = json.loads((out_dir / "metrics.json").read_text())
  assert metrics["task"] == "synthetic_copy" and metrics["kl"] > 0
  assert metrics["kl_term"] == pytest.approx(metrics["kl"] / 450000, rel=1e-5)
  assert metrics["neg_elbo"] == pytest.approx(metrics["sampled_nll"] + metrics["kl_term"],
                                              rel=1e-5)
  # INPUT_FILE as OUTPUT_FILE (or its scores file), also through a link: refused, input kept.
  inputs = tmp_path / "in.txt"
  inputs.write_text("5 6 7 8\n")
  (tmp_path / "link.txt").symlink_to(inputs)
  for output in (inputs, tmp_path / "link.txt", tmp_path / ".." / tmp_path.name / "in.txt"):
    code, _, err = command(capsys, "infer", "--gin_file=runs/infer.gin", *common,
                           f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_FILE='{output}'")
    assert code == 1 and (f"infer: OUTPUT_FILE '{output}' is INPUT_FILE '{inputs}' (it would "
                          "overwrite the inputs); give another OUTPUT_FILE") in err, err[-2000:]
  code, _, err = command(capsys, "infer", "--gin_file=runs/infer.gin", *common,
                         f"--gin.INPUT_FILE='{inputs}.scores.jsonl'",
                         f"--gin.OUTPUT_FILE='{inputs}'")
  assert code == 1 and "OUTPUT_FILE + '.scores.jsonl'" in err
  assert inputs.read_text() == "5 6 7 8\n"
  # A batch the mesh's data axis does not divide: the setting to change, before any work.
  code, _, err = command(capsys, "infer", "--gin_file=runs/infer.gin", *common,
                         "--gin.BATCH_SIZE=3", f"--gin.INPUT_FILE='{inputs}'",
                         f"--gin.OUTPUT_FILE='{tmp_path / 'out.txt'}'")
  assert code == 1 and re.search(r"infer: BATCH_SIZE=3: global batch of 3 examples cannot be "
                                 r"split into 8 equal shards over mesh axes .*; use a multiple "
                                 r"of 8", err), err[-2000:]


def test_a_run_refuses_another_vocabulary_in_one_line():
  from types import SimpleNamespace

  from meshbayes.data import IdVocabulary
  from meshbayes.training.checkpoint_restore import check_vocabulary

  data = SimpleNamespace(task="synthetic_reverse", vocabulary=IdVocabulary(64))
  check_vocabulary({"vocabulary": "IdVocabulary:64"}, data, "runs/a")
  check_vocabulary({}, data, "runs/a")  # a run older than the record
  with pytest.raises(ValueError, match=re.escape(
      "the run runs/a was trained with the vocabulary of task 'tatoeba_enfr' "
      "(sha256:0123456789abcdef), not with task 'synthetic_reverse''s (IdVocabulary:64): use "
      "the run's task, or one with its vocabulary")):
    check_vocabulary({"vocabulary": "sha256:0123456789abcdef", "task": "tatoeba_enfr"}, data,
                     "runs/a")


def test_evaluate_infer_and_show_a_trained_run(trained, tmp_path, capsys):
  common = [f"--gin.MODEL_DIR='{trained}'", "--gin.BATCH_SIZE=64",
            "--gin.models.EncoderDecoderModel.num_train_units=450000",
            "--gin.evaluation.ReportConfig.bootstrap_resamples=50"]
  run_files = lambda run: ["--gin_file=models/tiny.gin", f"--gin_file=runs/{run}.gin",
                           "--gin_file=tasks/synthetic.gin"]
  code, out, err = command(capsys, "evaluate", *run_files("eval"), *common,
                         "--gin.evaluation.DecodeConfig.method='greedy'",
                         "--gin.data.TaskData.max_eval_batches=2",
                         "--gin.evaluation.OodConfig.shuffled_words=True",
                         "--gin.evaluation.OodConfig.max_examples=100",
                         "--gin.evaluation.PredictiveConfig.temperature_scaling=True",
                         "--gin.evaluation.OodConfig.targets_as_inputs=True")
  assert code == 0, err[-2000:]
  out_dir = trained / "eval" / "synthetic_reverse"
  metrics = json.loads((out_dir / "metrics.json").read_text())
  assert metrics["step"] == 8 and metrics["num_sources"] == metrics["num_pairs"] == 128
  assert {"nll", "accuracy", "neg_elbo", "exact_match", "bleu", "token_ece",
          "sequence_ece"} <= set(metrics)
  assert metrics["predictives"] == ["model_average", "posterior_mean",
                                    "model_average_temperature_scaled",
                                    "posterior_mean_temperature_scaled"]
  fits = metrics["temperature_fits"]  # each predictive its own temperature
  assert set(fits) == set(metrics["predictives"][2:])
  assert metrics["temperature_scaling"] == fits["model_average_temperature_scaled"]
  for fit in fits.values():
    assert min(fit["nll"]) <= fit["nll_at_1"] and 0.125 <= fit["temperature"] <= 8
  assert set(metrics["decoding"]) == set(metrics["predictives"])
  decoded_tokens = metrics["decoding"]["model_average"]
  assert 0 <= decoded_tokens["decoded_token_ece"] <= 1
  assert 0 <= decoded_tokens["decoded_token_accuracy"] <= 1
  assert "decoded_token_ece" in metrics["intervals"]["model_average"]
  assert 0 <= metrics["token_calibration"]["model_average"]["ece"] <= 1
  assert metrics["ood"]["shuffled_words"]["num_examples"] == 100
  assert metrics["ood"]["targets_as_inputs"]["num_examples"] == 100
  assert 0 <= metrics["ood"]["targets_as_inputs"]["fpr95_mutual_information"] <= 1
  for name in metrics["predictives"]:
    assert len((out_dir / f"predictions_{name}.jsonl").read_text().splitlines()) == 128
    bleu = metrics["intervals"][name]["bleu"]
    assert bleu["low"] <= metrics["decoding"][name]["bleu"] == bleu["estimate"] <= bleu["high"]
  # Temperature scaling rescores each predictive's outputs: the same translations.
  for name in ("model_average", "posterior_mean"):
    assert metrics["decoding"][f"{name}_temperature_scaled"]["bleu"] == \
        metrics["decoding"][name]["bleu"]
  auroc = metrics["ood_intervals"]["shuffled_words"]["auroc_total_uncertainty"]
  assert auroc["low"] <= metrics["ood"]["shuffled_words"]["auroc_total_uncertainty"] <= auroc["high"]
  assert (out_dir / "reliability.png").stat().st_size > 0
  assert not (out_dir / "partial").exists()  # the saved decodes go once results are written
  # Progress bars on stderr; the metrics as TensorBoard scalars and a JSON line too.
  assert "token calibration (model_average)" in err and "decoding shuffled_words" in err
  # One line per phase, numbered, the time left once a pass is timed, and the total.
  phases = [line for line in out.splitlines() if line.startswith("phase ")]
  assert [line.split(":")[0] for line in phases] == [f"phase {k}/15" for k in range(1, 16)], phases
  assert phases[0] == "phase 1/15: reading synthetic_reverse/validation"
  assert phases[3].startswith("phase 4/15: fitting the temperature of posterior_mean on "
                              "validation")
  assert phases[-1].startswith("phase 15/15: decoding shuffled_words (greedy); about ")
  assert "decoding synthetic_reverse sources (model_average); about " in phases[8]
  assert "scoring synthetic_reverse sources (posterior_mean_temperature_scaled)" in phases[11]
  assert re.search(r"^evaluation done in [0-9.]+ (s|min)$", out, flags=re.MULTILINE), out[-500:]
  scalars = events(out_dir)
  assert scalars[("validation/bleu", 8)] == pytest.approx(metrics["bleu"], rel=1e-6)
  assert scalars[("validation/ood/shuffled_words/auroc_total_uncertainty", 8)] == pytest.approx(
      metrics["ood"]["shuffled_words"]["auroc_total_uncertainty"], rel=1e-6)
  logged = json.loads((out_dir / "metrics.jsonl").read_text().splitlines()[-1])
  assert logged["step"] == 8 and logged["validation/token_calibration/model_average/ece"] == \
      metrics["token_calibration"]["model_average"]["ece"]

  inputs, outputs = tmp_path / "in.txt", tmp_path / "out.txt"
  inputs.write_text("5 6 7 8\n9 10 11\n2 3\n")
  code, _, err = command(capsys, "infer", *run_files("infer"), *common,
                         f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_FILE='{outputs}'",
                         "--gin.infer.num_samples=2")
  assert code == 0, err[-2000:]
  assert len(outputs.read_text().splitlines()) == 3
  scores = [json.loads(line) for line in Path(f"{outputs}.scores.jsonl").read_text().splitlines()]
  assert len(scores) == 3 and all(s["log_prob"] <= 0 and s["mutual_information"] >= 0
                                  for s in scores)
  bad = tmp_path / "bad.txt"
  bad.write_text("5 6\n5 x\n")
  code, _, err = command(capsys, "infer", *run_files("infer"), *common,
                         f"--gin.INPUT_FILE='{bad}'", f"--gin.OUTPUT_FILE='{outputs}'")
  assert code == 1 and f"{bad}:2: cannot encode '5 x'" in err

  assert inspect_checkpoint.main(["show", str(trained)]) == 0
  shown = capsys.readouterr().out
  assert "encoder/layers/attention/query/kernel_scale" in shown
  assert "(layers, embed, heads, kv)" in shown and "posterior standard deviation" in shown
  assert inspect_checkpoint.main(["show", str(tmp_path / "nothing")]) == 2


def test_ood_beam_sets_set_beam_measures_against_the_splits_own_beams(trained, capsys):
  """``OodConfig.beam_sets``: the set is also decoded by beam search, its beam-level
  measures set against the split's first sources as their beam search decoded them (the
  same arrays); the other sets have none; without the split's beam measures, one line."""
  evaluate = lambda *bindings: command(
      capsys, "evaluate", "--gin_file=models/tiny.gin", "--gin_file=runs/eval.gin",
      "--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{trained}'", "--gin.BATCH_SIZE=64",
      "--gin.models.EncoderDecoderModel.num_train_units=450000",
      "--gin.data.TaskData.max_eval_batches=1", "--gin.evaluation.PredictiveConfig.num_samples=2",
      "--gin.evaluation.DecodeConfig.beam_size=2", "--gin.evaluation.OodConfig.max_examples=32",
      "--gin.evaluation.OodConfig.shuffled_words=True",
      "--gin.evaluation.OodConfig.targets_as_inputs=True",
      "--gin.evaluation.OodConfig.beam_sets=['shuffled_words']",
      "--gin.evaluation.ReportConfig.bootstrap_resamples=20", *bindings)
  code, _, err = evaluate("--gin.evaluation.PredictiveConfig.beam_measures=False")
  assert code != 0 and (
      "meshbayes.eval: error: evaluate: OodConfig.beam_sets=['shuffled_words'] need the split "
      "decoded by beam search with PredictiveConfig.beam_measures=True (traceback in ") in err
  code, out, err = evaluate("--gin.evaluation.PredictiveConfig.beam_measures=True")
  assert code == 0, err[-2000:]
  out_dir = trained / "eval" / "synthetic_reverse"
  metrics = json.loads((out_dir / "metrics.json").read_text())
  beam = {"auroc_beam_total_uncertainty", "auroc_beam_mutual_information"}
  assert beam <= set(metrics["ood"]["shuffled_words"])
  assert not beam & set(metrics["ood"]["targets_as_inputs"])
  assert "decoding shuffled_words (beam)" in out
  scores = np.load(out_dir / "ood_scores.npz")
  records = [json.loads(line) for line in
             (out_dir / "predictions_model_average.jsonl").read_text().splitlines()][:32]
  for name in ("beam_total_uncertainty", "beam_mutual_information"):
    np.testing.assert_allclose(scores[f"in_domain/{name}"], [r[name] for r in records],
                               rtol=1e-6)
    assert len(scores[f"ood/shuffled_words/{name}"]) == 32
    assert metrics["ood"]["shuffled_words"][f"auroc_{name}"] == pytest.approx(
        ood_metrics.auroc(scores[f"in_domain/{name}"], scores[f"ood/shuffled_words/{name}"]))


@pytest.mark.slow  # two trainings and two evaluations; the model paths are tested in make test
def test_evaluate_mc_dropout_and_a_deep_ensemble_through_the_command(tmp_path, capsys):
  """The baselines through ``meshbayes.eval``: MC dropout on a deterministic run trained
  with dropout, and a deep ensemble of two seeds, each reported as a model average."""
  runs = [tmp_path / f"seed{seed}" for seed in (0, 1)]
  for seed, model_dir in enumerate(runs):
    code, _, err = train(capsys, *train_args(
        model_dir, 4, f"--gin.train.seed={seed}",
        "--gin.models.TransformerConfig.dropout_rate=0.1", kind="deterministic"))
    assert code == 0, err[-2000:]
  evaluate = lambda *bindings: command(
      capsys, "evaluate", "--gin_file=runs/eval.gin", "--gin_file=tasks/synthetic.gin",
      f"--gin.MODEL_DIR='{runs[0]}'", "--gin.BATCH_SIZE=64",
      "--gin.data.TaskData.max_eval_batches=2", "--gin.evaluation.PredictiveConfig.num_samples=2",
      "--gin.evaluation.DecodeConfig.method='greedy'",
      "--gin.evaluation.OodConfig.shuffled_words=True", "--gin.evaluation.OodConfig.max_examples=64",
      "--gin.evaluation.ReportConfig.bootstrap_resamples=50", *bindings,
      model_from_model_dir=True)
  out_dir = runs[0] / "eval" / "synthetic_reverse"
  results = {}
  for name, binding in (("mc_dropout", "--gin.evaluation.PredictiveConfig.method='mc_dropout'"),
                        ("ensemble",
                         f"--gin.evaluation.PredictiveConfig.ensemble_dirs=['{runs[1]}']")):
    code, _, err = evaluate(binding)
    assert code == 0, err[-2000:]
    results[name] = json.loads((out_dir / "metrics.json").read_text())
  for name, metrics in results.items():
    assert metrics["num_sources"] == 128, name
    assert "model_average" in metrics["predictives"], (name, metrics["predictives"])
    ood = metrics["ood"]["shuffled_words"]
    # Two samples that differ: the mutual information is a score, not a constant zero.
    assert 0 <= ood["auroc_mutual_information"] <= 1 and ood["num_examples"] == 64, name
  assert results["ensemble"]["ensemble"] == [str(runs[0]), str(runs[1])]
  assert results["ensemble"]["num_samples"] == 2


def test_evaluate_a_deterministic_run_by_its_last_layer_laplace(tmp_path, capsys):
  """The Laplace method through ``meshbayes.eval``: fitted on the training split, its prior
  chosen on validation, reported as a model average; the old MC dropout flag is one line.
  The run's config.gin holds what a run trained with the gin files before evaluate's
  settings were grouped holds (evaluate's former bindings, from a task file): it evaluates."""
  model_dir = tmp_path / "det"
  code, _, err = train(capsys, *train_args(model_dir, 4, kind="deterministic"))
  assert code == 0, err[-2000:]
  with (model_dir / "config.gin").open("a") as config:
    config.write("evaluate.ood_files = {'spanish': 'tatoeba/spa-eng/ood_spanish.txt'}\n"
                 "evaluate.ood_targets_as_inputs = True\nevaluate.num_samples = 4\n")
  evaluate = lambda *bindings: command(
      capsys, "evaluate", "--gin_file=runs/eval.gin", "--gin_file=tasks/synthetic.gin",
      f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=64",
      "--gin.data.TaskData.max_eval_batches=1", "--gin.evaluation.PredictiveConfig.num_samples=2",
      "--gin.evaluation.DecodeConfig.method='greedy'",
      "--gin.evaluation.ReportConfig.bootstrap_resamples=20",
      *bindings, model_from_model_dir=True)
  code, _, err = evaluate("--gin.evaluation.PredictiveConfig.method='laplace'")
  assert code == 0, err[-2000:]
  assert re.search(r"laplace: prior precision \S+ \(validation NLL per token 0.01: ", err)
  metrics = json.loads((model_dir / "eval" / "synthetic_reverse" / "metrics.json").read_text())
  assert metrics["predictives"] == ["model_average", "posterior_mean"]
  assert 0 <= metrics["token_calibration"]["model_average"]["ece"] <= 1
  code, _, err = evaluate("--gin.evaluate.mc_dropout=True")
  assert code == 1 and ("evaluate.mc_dropout moved: bind evaluation.PredictiveConfig.method (e.g. "
                        "--gin.evaluation.PredictiveConfig.method=\"'mc_dropout'\"), or drop it "
                        "for the run as trained" in err.strip().splitlines()[-1])
