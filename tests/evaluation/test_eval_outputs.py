"""What an evaluation writes is one set under its manifest: a set replaces the one before it
whole, a file of another evaluation (another step, method, or changed since) is refused in
one line, a directory from before manifests is read with one warning; the JSON is strict,
``metrics.json`` names the method and why a figure is null; no NaN reaches TensorBoard."""

import json
import logging
import re
import shutil

import numpy as np
import pytest
from etils import epath

from meshbayes import metrics
from meshbayes.evaluation import items as evaluation_items
from meshbayes.evaluation import resumable, writer
from meshbayes.evaluation.items import SourceItems
from meshbayes.evaluation.predictives import Decoded
from meshbayes.runtime import strict_json
from meshbayes.runtime.metrics_writer import MetricsWriter
from tests.evaluation.made_items import make_items
from tests.training.runs import command, eval_args, events, train_args, train_or_fail

PREDICTIVE = "model_average"


def write_set(directory, step, decoded=True, method="as_trained", quality=0.5):
  """One evaluation's outputs as ``evaluate`` writes them (``writer.write_results``), of
  20 sources' items (``quality`` 0: no output matches a reference); returns the items."""
  items = make_items(3, n=20, quality=quality)
  if not decoded:
    items = SourceItems(items.sources, items.token_statistics)
  intervals = evaluation_items.intervals(items, num_resamples=10)
  token = metrics.token_calibration_metrics({k: np.sum(v, axis=0)
                                             for k, v in items.token_statistics.items()})
  reliability = {PREDICTIVE: {"token": {k: v for k, v in token.items() if k.startswith("bin_")}}}
  result = {"step": step, "method": method, "task": "synthetic_reverse", "split": "validation",
            "predictives": [PREDICTIVE], "token_ece": token["ece"],
            "intervals": {PREDICTIVE: evaluation_items.as_json(intervals)}}
  if decoded:
    result["decoding"] = {PREDICTIVE: {k: v.estimate for k, v in intervals.items()}}
    reliability[PREDICTIVE]["sequence"] = metrics.equal_mass_reliability(
        np.exp(items.log_probs), items.exact_match, 5)
  writer.write_results(epath.Path(directory), result, reliability, "run", {PREDICTIVE: items},
                       None, {"step": step, "decoding": {"enabled": decoded}})
  return items


def test_a_set_without_decoding_replaces_the_decoded_set_of_another_step(tmp_path, capsys):
  """The user's case: step 20 evaluated with decoding, then step 300 without, into one
  directory: step 20's predictions go with its set; read as step 20's, refused."""
  from meshbayes.evaluation import manifest  # pylint: disable=import-outside-toplevel
  write_set(tmp_path, 20, decoded=True)
  assert (tmp_path / f"predictions_{PREDICTIVE}.jsonl").exists()
  write_set(tmp_path, 300, decoded=False)
  assert not (tmp_path / f"predictions_{PREDICTIVE}.jsonl").exists()
  again = evaluation_items.read_items(tmp_path, PREDICTIVE, step=300, method="as_trained")
  assert not again.decoded and len(again) == 20
  with pytest.raises(ValueError) as refused:
    evaluation_items.read_items(tmp_path, PREDICTIVE, step=20)
  assert str(refused.value) == (f"{tmp_path}/token_statistics_{PREDICTIVE}.npz: the token "
                                f"statistics of {PREDICTIVE} of step 300 (manifest.json), "
                                "expected step 20")
  with pytest.raises(ValueError, match="of method 'as_trained' .*, expected method 'laplace'$"):
    evaluation_items.read_items(tmp_path, PREDICTIVE, method="laplace")
  written = json.loads((tmp_path / "manifest.json").read_text())
  assert (written["step"], written["method"], written["task"], written["split"]) == (
      300, "as_trained", "synthetic_reverse", "validation")
  assert sorted(written["files"]) == ["metrics.json", "reliability.json", "reliability.png",
                                      f"token_statistics_{PREDICTIVE}.npz"]
  assert written["settings_fingerprint"] == manifest.settings_fingerprint(
      {"step": 300, "decoding": {"enabled": False}})
  assert "warning" not in capsys.readouterr().err


def test_a_stale_foreign_or_changed_file_is_refused_in_one_line(tmp_path):
  """A predictions file of another set beside this one (as the old code left it), or a
  file changed since its set was written: refused, naming the file and why."""
  older, newer = tmp_path / "older", tmp_path / "newer"
  older.mkdir()
  newer.mkdir()
  write_set(older, 20, decoded=True)
  write_set(newer, 300, decoded=False)
  stale = newer / f"predictions_{PREDICTIVE}.jsonl"
  shutil.copy(older / stale.name, stale)
  with pytest.raises(ValueError) as refused:
    evaluation_items.read_items(newer, PREDICTIVE)
  assert str(refused.value) == (
      f"{stale}: the predictions of {PREDICTIVE} not in manifest.json (the set of step 300, "
      "method as_trained): a file of another evaluation; remove it or evaluate again")
  stale.unlink()
  statistics = newer / f"token_statistics_{PREDICTIVE}.npz"
  other = make_items(4, n=20)  # the same name, another evaluation's contents
  evaluation_items.write_items(SourceItems(other.sources, other.token_statistics), newer,
                               PREDICTIVE)
  with pytest.raises(ValueError, match=re.escape(
      f"{statistics}: the token statistics of {PREDICTIVE} whose checksum differs from "
      "manifest.json's (the set of step 300, method as_trained): changed or replaced since "
      "that evaluation wrote it")):
    evaluation_items.read_items(newer, PREDICTIVE)
  ood = newer / "ood_scores.npz"
  shutil.copy(statistics, ood)
  with pytest.raises(ValueError, match="ood_scores.npz: the OOD scores not in manifest.json"):
    evaluation_items.read_ood_scores(newer)


def test_the_manifest_comes_last_and_a_set_without_one_is_read_with_one_warning(
    tmp_path, capsys, monkeypatch):
  """While a set is written its manifest says so (readers refuse); a directory without a
  manifest (written before them) is read as it is, with one warning line."""
  from meshbayes.evaluation import manifest  # pylint: disable=import-outside-toplevel
  seen = []
  finish = manifest.finish

  def finish_and_see(directory, files, **kwargs):
    seen.append(json.loads((directory / "manifest.json").read_text()))
    with pytest.raises(ValueError, match="an evaluation is writing its results there or was "
                       "interrupted while writing them; evaluate again"):
      evaluation_items.read_items(directory, PREDICTIVE)
    finish(directory, files, **kwargs)

  monkeypatch.setattr(manifest, "finish", finish_and_see)
  items = write_set(tmp_path, 300, decoded=True)
  assert seen == [{"format": 1, "complete": False}]
  (tmp_path / "manifest.json").unlink()  # as before manifests
  capsys.readouterr()
  for _ in range(2):
    again = evaluation_items.read_items(tmp_path, PREDICTIVE, step=300)
    assert again.predictions == items.predictions
  assert capsys.readouterr().err == (
      f"warning: {tmp_path} has no manifest.json (written before evaluations had one): its "
      "files cannot be checked for step or method\n")


def test_re_evaluating_removes_a_manifestless_directorys_outputs_and_keeps_the_history(
    tmp_path):
  """A directory of the old layout: its outputs go when a set is written, its history
  (metrics.jsonl, the saved decodes) stays."""
  evaluation_items.write_items(make_items(1, n=5), tmp_path, "posterior_mean")
  (tmp_path / "ood_scores.npz").write_bytes(b"old")
  (tmp_path / "metrics.jsonl").write_text('{"step": 20}\n')
  (tmp_path / resumable.PARTIAL_DIR).mkdir()
  (tmp_path / resumable.PARTIAL_DIR / "decoded_model_average.jsonl").write_text("{}\n")
  write_set(tmp_path, 300, decoded=False)
  assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("events.")) == [
      "manifest.json", "metrics.json", "metrics.jsonl", "partial", "reliability.json",
      "reliability.png", f"token_statistics_{PREDICTIVE}.npz"]
  assert [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()
          ] == [20, 300]


def test_metrics_json_is_strict_names_the_method_and_why_a_figure_is_null(tmp_path, caplog):
  """No output matches a reference: the calibration AUROC is undefined; metrics.json has it
  null with that reason, the method, and no NaN; TensorBoard leaves it out, silently."""
  items = write_set(tmp_path, 300, decoded=True, method="laplace", quality=0.0)
  assert not items.exact_match.any()
  text = (tmp_path / "metrics.json").read_text()
  written = strict_json.loads_strict(text)
  assert written["method"] == "laplace"
  assert written["decoding"][PREDICTIVE]["calibration_auroc"] is None
  assert written["null_reasons"][f"decoding/{PREDICTIVE}/calibration_auroc"] == (
      "nan: one class only (exact_match_positives 0 of 20 outputs): the AUROC needs outputs "
      "that match a reference and outputs that do not")
  strict_json.loads_strict((tmp_path / "reliability.json").read_text())
  for line in (tmp_path / f"predictions_{PREDICTIVE}.jsonl").read_text().splitlines():
    strict_json.loads_strict(line)
  logged = strict_json.loads_strict((tmp_path / "metrics.jsonl").read_text())
  tag = f"validation/decoding/{PREDICTIVE}/calibration_auroc"
  assert logged[tag] is None and logged["null_reasons"][tag] == (
      "nan: undefined; left out of TensorBoard")
  scalars = {name for name, _ in events(tmp_path)}
  assert tag not in scalars and f"validation/decoding/{PREDICTIVE}/bleu" in scalars
  assert not [r for r in caplog.records if "NaN" in r.getMessage()]


def test_tensorboard_gets_no_nan_and_the_json_line_says_why(tmp_path, caplog):
  writer_ = MetricsWriter(tmp_path, tmp_path / "metrics.jsonl")
  with caplog.at_level(logging.WARNING):
    writer_.write(3, {"a": 1.5, "b": float("nan"), "c": float("inf")})
  writer_.close()
  assert not caplog.records
  assert events(tmp_path) == {("a", 3): 1.5}
  assert strict_json.loads_strict((tmp_path / "metrics.jsonl").read_text()) == {
      "step": 3, "a": 1.5, "b": None, "c": None, "null_reasons": {
          "b": "nan: undefined; left out of TensorBoard",
          "c": "inf: not a finite number; left out of TensorBoard"}}


def test_saved_decodes_are_strict_json_and_resume_their_non_finite_numbers(tmp_path):
  fingerprint = {"step": 4, "variant": ["model_average", 2, None]}
  record = Decoded((5, 6), -1.5, 3, 0.5, float("nan"), {"total_uncertainty": float("inf")},
                   (-0.5, -1.0, float("-inf")))
  resumable.DecodeLog(tmp_path, PREDICTIVE, fingerprint).save(0, [record])
  lines = (tmp_path / "partial" / f"decoded_{PREDICTIVE}.jsonl").read_text().splitlines()
  assert [strict_json.loads_strict(line) for line in lines][0] == fingerprint
  resumed = resumable.DecodeLog(tmp_path, PREDICTIVE, fingerprint).done
  assert len(resumed) == 1 and resumed[0][0].output_ids == (5, 6)
  assert np.isnan(resumed[0][0].mutual_information)
  assert resumed[0][0].measures == {"total_uncertainty": float("inf")}
  assert resumed[0][0].token_log_probs == (-0.5, -1.0, float("-inf"))


@pytest.mark.integration
def test_evaluate_without_decoding_after_a_decoded_evaluation(tmp_path, capsys):
  """``python -m meshbayes.eval`` on a tiny run (test_cli_model_config's), after the decoded
  items of another step: its set replaces them; metrics.json names the method."""
  model_dir = tmp_path / "run"
  train_or_fail(train_args(model_dir, 2, kind="deterministic"))
  out_dir = model_dir / "eval" / "synthetic_reverse"
  out_dir.mkdir(parents=True)
  evaluation_items.write_items(make_items(3, n=8), out_dir, "posterior_mean")  # another step's
  code, out, err = command(
      capsys, "evaluate",
      *eval_args(model_dir, "--gin.evaluation.ReportConfig.bootstrap_resamples=10"),
      model_from_model_dir=True)
  assert code == 0, err[-2000:]
  assert not (out_dir / "predictions_posterior_mean.jsonl").exists()
  written = strict_json.loads_strict((out_dir / "metrics.json").read_text())
  assert (written["step"], written["method"]) == (2, "deterministic")
  again = evaluation_items.read_items(out_dir, "posterior_mean", step=2, method="deterministic")
  assert not again.decoded and len(again) == written["num_sources"]
  assert "NaN or Inf" not in out + err and "warning" not in err
