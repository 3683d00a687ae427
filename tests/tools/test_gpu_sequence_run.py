"""The GPU sequence-calibration tool at toy size (``tools/gpu_sequence_run.py``): a fake Tatoeba
corpus exported as token-id arrays, both recipes trained and decoded on a CPU in a process
that never imports seqio or TensorFlow, and the outputs scored with the evaluation's figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from meshbayes import data, metrics
from meshbayes.data import arrays as arrays_lib, tatoeba
from meshbayes.data.pipeline import get_task
from meshbayes.evaluation import token_arrays
from meshbayes.evaluation.sources import group_sources
from meshbayes.partitioning import DataLayout, Partitioner
from meshbayes.metrics import sequence_calibration, sequence_labels, token_labels
from meshbayes.tools import gpu_sequence_run as tool
from meshbayes.training import array_training, step_loop
from meshbayes.training.train_step import (StepFunctions, abstract_state, init_train_state,
                                           jit_train_step)
from tests.data import corpus

ROOT = Path(__file__).resolve().parents[2]
# A toy model (the experiment's toy preset's sizes), 2 steps, 2 weight samples, 2 beams.
TOY_MODEL = {"emb_dim": 16, "mlp_dim": 16, "num_heads": 2, "head_dim": 8,
             "num_encoder_layers": 1, "num_decoder_layers": 1}
TOY = ["--train_steps=2", "--steps_per_call=2", "--num_samples=2", "--beam_size=2",
       "--eval_batch_size=8", "--binding=BATCH_SIZE=8",
       *(f"--binding=models.TransformerConfig.{k}={v}" for k, v in TOY_MODEL.items())]
# The run in a process of its own, which then proves it never imported seqio or TensorFlow.
RUN = ("import sys\nfrom meshbayes.tools import gpu_sequence_run as tool\ntool.main(sys.argv[1:])\n"
       "assert all(sys.modules.get(name) is None for name in tool.REFUSED_MODULES)\n"
       "print('imported neither')\n")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """The fake corpus prepared with a 40-piece vocabulary and exported: ``(data dir, path)``;
  MESHBAYES_DATA_DIR points at it for the module's tests."""
  root = tmp_path_factory.mktemp("gpu_sequence")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MESHBAYES_DATA_DIR", str(root / "data"))
    corpus.prepare_with_vocabulary(root / "data")
    tool.main(["export", "--task=tatoeba_enfr", f"--out={root / 'arrays.npz'}"])
    yield root / "data", root / "arrays.npz"


@pytest.fixture(scope="module")
def run_outputs(exported, tmp_path_factory):
  """``run`` of both recipes at toy size, in a subprocess; its OUT folder and stdout."""
  out = tmp_path_factory.mktemp("gpu_sequence_out")
  done = subprocess.run([sys.executable, "-c", RUN, "run", f"--arrays={exported[1]}",
                         f"--out={out}", *TOY], cwd=ROOT, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return out, done.stdout


@pytest.mark.integration
def test_export_holds_the_splits_as_the_evaluation_reads_them(exported):
  data_dir, path = exported
  arrays, meta = arrays_lib.load_arrays(path)
  lengths = meta["feature_lengths"]
  assert lengths == {"inputs": 24, "targets": 32} and meta["vocab_size"] == 40
  assert all(a.dtype == np.uint16 for k, a in arrays.items() if "inputs" in k or "ids" in k
             or "targets" in k)
  # Each split's pairs, as the evaluation's batches hold them, features rebuilt as seqio's.
  for split in arrays_lib.SPLITS:
    batches = list(data.TaskData("tatoeba_enfr", lengths, 16, shuffle=False).eval_batches(
        DataLayout(16), split))
    seqio_rows = {k: np.concatenate([b[k] for b in batches]) for k in arrays_lib.FEATURES}
    present = seqio_rows["encoder_input_tokens"].any(-1)
    rebuilt = arrays_lib.features(arrays_lib.padded(arrays[f"{split}_inputs"], lengths["inputs"]),
                            arrays_lib.padded(arrays[f"{split}_targets"], lengths["targets"]))
    for name in arrays_lib.FEATURES:
      np.testing.assert_array_equal(rebuilt[name], seqio_rows[name][present], err_msg=name)
    assert meta[f"{split}_pairs"] == present.sum() > 0
  assert meta["num_train_units"] == data.train_set_size("tatoeba_enfr", lengths, "tokens")
  # The test sources decode back to the split file's English, their references to its French.
  sources = token_arrays.split_sources(arrays, meta)
  pairs = tatoeba.read_tsv(tatoeba.split_path(data_dir, "test")).pairs
  expected = {}
  for pair in pairs:
    expected.setdefault(pair.english, set()).add(pair.translation)
  assert dict(zip(sources.texts, map(set, sources.references))) == expected
  assert len(sources.texts) == meta["test_sources"] == len(expected)
  # ... and are what the evaluation's grouping gives.
  vocabulary = get_task("tatoeba_enfr").output_features["targets"].vocabulary
  grouped = group_sources([{"encoder_input_tokens": rebuilt["encoder_input_tokens"],
                            "decoder_target_tokens": rebuilt["decoder_target_tokens"]}],
                          vocabulary, vocabulary)
  assert (grouped.texts, grouped.references, grouped.reference_ids) == (
      sources.texts, sources.references, sources.reference_ids)
  np.testing.assert_array_equal(grouped.row_source, sources.row_source)
  np.testing.assert_array_equal(grouped.inputs, sources.inputs)


@pytest.mark.integration
def test_run_trains_and_decodes_both_recipes_without_seqio(exported, run_outputs):
  out, stdout = run_outputs
  assert "imported neither" in stdout
  arrays, meta = arrays_lib.load_arrays(exported[1])
  report = json.loads((out / "run.json").read_text())
  assert set(report["recipes"]) == {"deterministic", "bayesian"}
  for name, log in report["recipes"].items():
    assert log["steps"] == 2 and log["batch_size"] == 8, name
    assert np.isfinite(log["chunks"][-1]["loss"]) and np.isfinite(log["validation"]["nll"])
  assert "Estimators.mlp = 'deterministic'" in report["recipes"]["deterministic"]["config"]
  assert "KLWeight.value = 0.1" in report["recipes"]["bayesian"]["config"]
  predictives = {}
  for name in tool.RECIPES:
    with np.load(out / f"{name}.npz") as stored:
      outputs = {k: stored[k] for k in stored.files}
    predictives[name] = list(dict.fromkeys(k.split("/")[0] for k in outputs))
    for predictive in predictives[name]:
      records = token_arrays.decoded_records(outputs, predictive)
      assert len(records) == meta["test_sources"]
      for record in records:  # the sequence's log-probability is its tokens' (EOS included)
        assert len(record.token_log_probs) == record.num_tokens == len(record.output_ids) + 1 \
            or record.num_tokens == 32
        assert record.log_prob == pytest.approx(sum(record.token_log_probs), abs=1e-4)
        assert all(0 < i < meta["vocab_size"] for i in record.output_ids)
      statistics = outputs[f"{predictive}/token_statistic/tokens"]
      np.testing.assert_allclose(statistics, (arrays["test_targets"] > 0).sum(-1))
  assert predictives == {"deterministic": ["posterior_mean"],
                         "bayesian": ["model_average", "posterior_mean"]}


def _with_exact_matches(outputs, sources, name):
  """``outputs`` with predictive ``name``'s output of every other source replaced by its first
  reference, given probability 0.6 spread over its tokens."""
  changed = dict(outputs)
  ids, token_log_probs = changed[f"{name}/output_ids"], changed[f"{name}/token_log_probs"]
  ids = np.pad(ids, [(0, 0), (0, 32 - ids.shape[1])]).astype(np.int64)
  token_log_probs, num_tokens = token_log_probs.copy(), changed[f"{name}/num_tokens"].copy()
  log_prob = changed[f"{name}/log_prob"].copy()
  for row in range(0, len(sources.texts), 2):
    reference = list(sources.reference_ids[row][0])
    ids[row] = 0
    ids[row, :len(reference)] = reference
    num_tokens[row] = len(reference) + 1
    token_log_probs[row] = 0
    token_log_probs[row, :num_tokens[row]] = np.log(0.6) / num_tokens[row]
    log_prob[row] = token_log_probs[row, :num_tokens[row]].astype(np.float64).sum()
  changed.update({f"{name}/output_ids": arrays_lib.compact(ids), f"{name}/num_tokens": num_tokens,
                  f"{name}/token_log_probs": token_log_probs, f"{name}/log_prob": log_prob})
  return changed


@pytest.mark.integration
def test_score_gives_the_library_figures(exported, run_outputs, tmp_path, capsys):
  arrays, meta = arrays_lib.load_arrays(exported[1])
  sources = token_arrays.split_sources(arrays, meta)
  for name in tool.RECIPES:  # half the sources matched exactly: positives to count
    with np.load(run_outputs[0] / f"{name}.npz") as stored:
      outputs = {k: stored[k] for k in stored.files}
    np.savez(tmp_path / f"{name}.npz", **_with_exact_matches(outputs, sources, "posterior_mean"))
  capsys.readouterr()
  figures = tool.main(["score", f"--arrays={exported[1]}", f"--outputs={tmp_path}",
                       "--bootstrap_resamples=20", f"--markdown={tmp_path / 'table.md'}",
                       f"--json={tmp_path / 'figures.json'}"])
  table = capsys.readouterr().out
  assert list(figures) == ["deterministic/posterior_mean", "bayesian/model_average",
                           "bayesian/posterior_mean"]
  assert table == (tmp_path / "table.md").read_text() and len(table.splitlines()) == 5
  vocabulary = get_task("tatoeba_enfr").output_features["targets"].vocabulary
  for key, figure in figures.items():
    recipe, predictive = key.split("/")
    with np.load(tmp_path / f"{recipe}.npz") as stored:
      records = token_arrays.decoded_records({k: stored[k] for k in stored.files}, predictive)
    predictions = [vocabulary.decode(list(r.output_ids)) for r in records]
    p = np.clip(np.exp([r.log_prob for r in records]), 0, 1)
    matched, num_references = sequence_labels.reference_match_counts(predictions,
                                                                     sources.references)
    expected = sequence_calibration.sequence_calibration_figures(p, matched > 0)
    labels = [token_labels.closest_reference_labels(r.output_ids, refs)
              for r, refs in zip(records, sources.reference_ids)]
    tokens = token_labels.decoded_token_metrics(token_labels.decoded_token_statistics(
        [np.exp(r.token_log_probs[:len(r.output_ids)]) for r in records], labels))
    assert figure["bleu"].estimate == pytest.approx(
        metrics.corpus_bleu(predictions, sources.references).score)
    assert figure["exact_match"].estimate == expected["exact_match"]
    if predictive == "posterior_mean":
      assert figure["exact_match_positives"].estimate == (len(sources.texts) + 1) // 2
      assert 0 <= figure["calibration_auroc"].estimate <= 1  # both labels present
    assert figure["sequence_ece"].estimate == pytest.approx(expected["ece"])
    assert figure["calibration_auroc"].estimate == pytest.approx(
        expected["calibration_auroc"], nan_ok=True)
    assert figure["fraction_ece"].estimate == pytest.approx(
        sequence_labels.fraction_calibration_figures(p, matched, num_references)["fraction_ece"])
    assert figure["decoded_token_ece"].estimate == pytest.approx(tokens["ece"], nan_ok=True)
    assert figure["sequence_ece_null_high"].estimate >= figure["sequence_ece_null_mean"].estimate
    assert f"| {key} | {figure['bleu'].format('.2f')} |" in table
    positives = f"{figure['exact_match_positives'].estimate:.0f} of {len(sources.texts)}"
    assert f"| {positives} (under 400: underpowered) |" in table
  stored = json.loads((tmp_path / "figures.json").read_text())
  assert stored["bayesian/model_average"]["sequence_ece"]["estimate"] == pytest.approx(
      figures["bayesian/model_average"]["sequence_ece"].estimate)


@pytest.mark.integration
def test_training_is_the_trainers_step_in_the_trainers_loop(exported):
  """``run``'s training, 2 steps per device call (a ``lax.scan``), has the per-step losses of
  the trainer's compiled step called once per step by the same loop on the same batches."""
  arrays, meta = arrays_lib.load_arrays(exported[1])
  lengths = meta["feature_lengths"]
  bindings = [arg.split("=", 1)[1] for arg in TOY if arg.startswith("--binding=")]
  setup = tool.recipe("bayesian", meta, bindings)
  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])
  trained = array_training.train(setup, arrays, lengths, partitioner, 5, None, 2)
  assert [chunk["step"] for chunk in trained.log["chunks"]] == [2, 4, 5]
  assert trained.log["steps"] == 5 and len(trained.losses) == 5
  assert trained.log["chunks"][0]["loss"] == pytest.approx(np.mean(trained.losses[:2]))
  # The trainer's way: its jitted step (jit_train_step) on each batch, one step per call.
  model = setup["model"]
  steps = StepFunctions.build(model, setup["optimizer"], setup["kl_weight"], setup["seed"])
  shapes = {name: (8, lengths["inputs" if name.startswith("encoder") else "targets"])
            for name in arrays_lib.FEATURES}
  shardings = partitioner.shardings(abstract_state(model, steps, shapes))
  state, _ = partitioner.init(lambda k: init_train_state(model, steps.optimizer, shapes, k),
                              jax.random.key(setup["seed"]))
  pairs = arrays_lib.split_features(arrays, "train", lengths)
  order = arrays_lib.batch_indices(len(arrays["train_inputs"]), 8, setup["seed"])
  step_fn = jit_train_step(steps, partitioner, shardings)

  def advance(state, count):
    assert count == 1
    rows = next(order)
    return step_fn(state, partitioner.global_batch({k: v[rows] for k, v in pairs.items()}))

  with partitioner.activation_rules():
    readings = list(step_loop.run_steps(advance, state, first_step=0, train_steps=5,
                                        reads_at=lambda step: step % 2 == 0))
  assert [reading.step for reading in readings] == [2, 4, 5]
  losses = [metrics["loss"] for reading in readings for _, metrics in reading.metrics]
  np.testing.assert_allclose(trained.losses, losses, rtol=2e-5)
  assert len(set(losses)) == 5  # the steps differ: a different batch or state shows


def test_the_loop_keeps_its_budgets_and_reads_only_when_asked():
  """``step_loop.run_steps`` on a counter: calls of up to ``steps_per_call`` steps, readings
  where asked and at the end, each step's metrics once, and no call after the time budget."""
  calls = []

  def advance(state, count):
    calls.append(count)
    return state + count, {"loss": np.arange(state + 1, state + count + 1, dtype=np.float32)}

  readings = list(step_loop.run_steps(advance, 0, first_step=0, train_steps=7,
                                      reads_at=lambda step: step == 3, steps_per_call=3))
  assert calls == [3, 3, 1]
  assert [(r.step, r.state, r.due) for r in readings] == [(3, 3, True), (7, 7, None)]
  assert [step for r in readings for step, _ in r.metrics] == list(range(1, 8))
  assert [m["loss"] for r in readings for _, m in r.metrics] == list(range(1, 8))
  # Resumed at step 4, one step a call: no reading until the end.
  readings = list(step_loop.run_steps(lambda s, n: (s + n, {"loss": np.float32(s)}), 4,
                                      first_step=4, train_steps=6, reads_at=lambda step: False))
  assert [(r.step, [step for step, _ in r.metrics]) for r in readings] == [(6, [5, 6])]
  # A spent time budget: no call at all.
  calls.clear()
  assert list(step_loop.run_steps(advance, 0, first_step=0, train_steps=7, train_seconds=1.0,
                                  started=-1e9, reads_at=lambda step: True)) == []
  assert calls == []
  with pytest.raises(ValueError, match="run_steps: steps_per_call=0 must be a positive int"):
    next(step_loop.run_steps(advance, 0, first_step=0, train_steps=1, steps_per_call=0,
                             reads_at=bool))


@pytest.mark.parametrize("argv, message", [
    (["run", "--arrays=a.npz", "--out=o", "--recipes=deterministic,ivon"], "--recipes="),
    (["run", "--arrays=a.npz", "--out=o", "--train_seconds=0"], "--train_seconds=0"),
    (["run", "--arrays=a.npz", "--out=o", "--beam_size=-2"], "--beam_size=-2"),
    (["export", "--task"], "--task"),
    (["score", "--arrays=a.npz", "--outputs=o", "--bootstrap_resamples=-1"],
     "--bootstrap_resamples=-1"),
])
def test_bad_arguments_are_one_line(argv, message, capsys):
  with pytest.raises(SystemExit) as raised:
    tool.parse_args(argv)
  assert raised.value.code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert message in error and "error:" in error


def test_bad_files_are_one_line(exported, tmp_path):
  with pytest.raises(ValueError, match="--arrays=.*missing.npz: no such file"):
    arrays_lib.load_arrays(tmp_path / "missing.npz")
  np.savez(tmp_path / "other.npz", x=np.zeros(2))
  with pytest.raises(ValueError, match="not an export"):
    arrays_lib.load_arrays(tmp_path / "other.npz")
  arrays, meta = arrays_lib.load_arrays(exported[1])
  with pytest.raises(ValueError, match=f"--outputs={tmp_path}: no deterministic.npz"):
    token_arrays.score(arrays, meta, tmp_path, 10, tool.RECIPES)
  with pytest.raises(ValueError, match="--task=nope: no .*tasks/nope.gin"):
    tool.main(["export", "--task=nope", f"--out={tmp_path / 'nope.npz'}"])
  with pytest.raises(ValueError, match="seqio.*already imported"):
    tool.refuse_imports()  # this process read the data through seqio
