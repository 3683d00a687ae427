"""The fault sweep tool: a short sweep finds no damage and reports one row per case; the
checks of issue 65's cases judge files written here by hand."""

import json
import subprocess
import sys

import pytest

from meshbayes.tools import fault_sweep
from tests.training.runs import ROOT


@pytest.mark.integration
@pytest.mark.slow  # a reference run, two interrupted chains and their resumes (minutes)
def test_a_short_sweep_finds_no_damage(tmp_path):
  table = tmp_path / "table.md"
  result = subprocess.run(
      [sys.executable, "-m", "meshbayes.tools.fault_sweep", f"--out={tmp_path / 'sweep'}",
       "--kills=1", "--sigterms=1", "--sigints=0", "--steps=8", "--sections=kill,signal",
       f"--markdown={table}"], capture_output=True, text=True, timeout=1800, cwd=ROOT)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  rows = table.read_text().splitlines()[2:]
  assert [row.split(" | ")[0] for row in rows if "final state" in row] == [
      "| kill-9 chain 1: final state", "| SIGTERM chain 1: final state"]
  assert all(row.rstrip().endswith("| none |") for row in rows), rows


@pytest.mark.integration
@pytest.mark.slow  # issue 65's cases: a tiny run, evaluations, kills, two long infers (~10 min)
def test_issue65_cases_all_pass(tmp_path):
  table = tmp_path / "table.md"
  result = subprocess.run(
      [sys.executable, "-m", "meshbayes.tools.fault_sweep", f"--out={tmp_path / 'sweep'}",
       f"--cases={','.join(fault_sweep.ISSUE65_CASES)}", f"--markdown={table}"],
      capture_output=True, text=True, timeout=3600, cwd=ROOT)
  rows = table.read_text().splitlines()[2:] if table.exists() else []
  assert result.returncode == 0, "\n".join(rows) or result.stderr[-3000:]
  assert len(rows) == 15, rows


@pytest.mark.integration
def test_bad_arguments_are_one_line():
  result = subprocess.run([sys.executable, "-m", "meshbayes.tools.fault_sweep",
                           "--sections=kill,typo"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "fault_sweep: error: --sections='kill,typo' must name some of ('kill', 'signal', "
      "'bad_input', 'issue65') and --steps=200 must be >= 8")
  result = fault_sweep_usage_error(["--cases=stale,stail"])
  assert result == ("fault_sweep: error: --cases='stale,stail' must name some of stale, "
                    "method, compute, infer, strict, frictions")


def fault_sweep_usage_error(argv):
  """The last stderr line of ``fault_sweep`` run with ``argv`` (a usage error: exit 2)."""
  result = subprocess.run([sys.executable, "-m", "meshbayes.tools.fault_sweep", *argv],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert result.returncode == 2
  return result.stderr.strip().splitlines()[-1]


def _write(directory, files):
  directory.mkdir(parents=True, exist_ok=True)
  for name, text in files.items():
    (directory / name).write_text(text)


def test_stale_set_names_each_file_of_another_evaluation(tmp_path):
  manifest = {"step": 12, "method": "bayesian",
              "files": ["metrics.json", "token_statistics_model_average.npz"]}
  _write(tmp_path, {"manifest.json": json.dumps(manifest), "metrics.json": "{}",
                    "token_statistics_model_average.npz": "x",
                    "predictions_model_average.jsonl": "{}\n",  # step 8's, left behind
                    "metrics.jsonl": "{}\n", "events.out.tfevents.1.vm": "x"})
  assert fault_sweep.stale_set(tmp_path, 12) == [
      "predictions_model_average.jsonl not in manifest.json"]
  assert fault_sweep.stale_set(tmp_path, 8) == [
      "manifest.json of step 12, not 8", "predictions_model_average.jsonl not in manifest.json"]
  (tmp_path / "predictions_model_average.jsonl").unlink()
  assert fault_sweep.stale_set(tmp_path, 12) == []
  # Records with a path, or a mapping by name, list files too.
  manifest["files"] = [{"path": "eval/x/metrics.json"}, {"name": "token_statistics_model_"
                                                                 "average.npz"}]
  (tmp_path / "manifest.json").write_text(json.dumps(manifest))
  assert fault_sweep.stale_set(tmp_path, 12) == []
  (tmp_path / "manifest.json").unlink()
  assert fault_sweep.stale_set(tmp_path, 12) == [
      "no manifest.json", "metrics.json not in manifest.json",
      "token_statistics_model_average.npz not in manifest.json"]


def test_compute_violations_are_steps_no_landed_checkpoint_backs(tmp_path):
  for name in ("4", "8", "12.orbax-checkpoint-tmp-1795932905"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)

  def attempts(*last_steps):
    (tmp_path / "compute.json").write_text(json.dumps([
        {"first_step": 0, "last_step": s, "cpu_seconds": 1.0, "wall_seconds": 1.0}
        for s in last_steps]))

  assert fault_sweep.compute_violations(tmp_path) == []  # no compute.json yet
  attempts(4, 8)
  assert fault_sweep.compute_violations(tmp_path) == []
  attempts(0, 12)  # step 0 was pruned (keep=N: a later one landed); 12 is still a temp dir
  assert fault_sweep.compute_violations(tmp_path) == [12]
  assert fault_sweep.landed_steps(tmp_path) == [4, 8]


def test_strict_json_problems_names_the_file_and_line(tmp_path):
  _write(tmp_path, {"metrics.json": '{"calibration_auroc": NaN}',
                    "ok.json": '{"calibration_auroc": null}',
                    "lines.jsonl": '{"a": 1}\n\n{"b": -Infinity}\n{"c": NaN}\n'})
  paths = [tmp_path / n for n in ("metrics.json", "ok.json", "lines.jsonl")]
  assert fault_sweep.strict_json_problems(paths) == [
      "metrics.json: non-standard JSON constant NaN",
      "lines.jsonl:3: non-standard JSON constant -Infinity"]


def test_infer_pairing_compares_each_text_line_with_its_scores(tmp_path):
  output = tmp_path / "out.txt"
  output.write_text("a b\n\nc\n")
  scores = tmp_path / "out.txt.scores.jsonl"
  scores.write_text("".join(json.dumps({"line": n, "output": t}) + "\n"
                            for n, t in enumerate(["a b", "", "c"], 1)))
  assert fault_sweep.infer_pairing(output, 3) == []
  assert fault_sweep.infer_pairing(output, 4) == ["3 text lines and 3 scores for 4 inputs"]
  output.write_text("x\n\ny\n")  # another infer's text over these scores
  assert fault_sweep.infer_pairing(output, 3) == [
      "2 lines whose scores are of another text (first: line 1)"]
  scores.unlink()
  assert fault_sweep.infer_pairing(output, 3) == ["missing: out.txt.scores.jsonl"]
