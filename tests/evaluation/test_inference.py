"""Inference (``meshbayes.infer``): one output line per input line, empty inputs, truncation
warnings, the scores file and a progress bar; the text and scores as one unit under a lock."""

import hashlib
import json
import os
import socket
import subprocess
import time

import jax
import numpy as np
import pytest

from meshbayes.evaluation import context, inference
from meshbayes.data import text_lines
from meshbayes.data import IdVocabulary, TaskData
from meshbayes.models.configurables import preset_config
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.evaluation.decoding import Decoded

VOCABULARY = IdVocabulary(size=32)


def test_read_lines_splits_at_newlines_only_and_names_a_bad_byte(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes("a b\r\n\n  \nc\u2028d\x85e\nlast".encode())
  assert text_lines.read_lines(path) == ["a b", "", "  ", "c\u2028d\x85e", "last"]
  assert text_lines.read_lines(path, skip_empty=True) == ["a b", "c\u2028d\x85e", "last"]
  path.write_bytes(b"one\n")
  assert text_lines.read_lines(path) == ["one"]
  path.write_bytes(b"")
  assert text_lines.read_lines(path) == []
  path.write_bytes(b"fine\nabc\xffdef\n")
  with pytest.raises(ValueError, match=rf"^{path}:2: not valid UTF-8 \(byte 0xff at position 4 "
                                       r"of the line\)$"):
    text_lines.read_lines(path)
  with pytest.raises(ValueError, match="does not exist"):
    text_lines.read_lines(tmp_path / "absent.txt")


def test_encode_inputs_leaves_empty_lines_empty_and_counts_cut_tokens():
  lines = ["5 6 7", "", "   ", "2 3 4 5 6 7 8 9 10 11", "9 10 11 12"]
  encoded = text_lines.encode_inputs(lines, VOCABULARY, length=5)
  np.testing.assert_array_equal(encoded.rows, [
      [5, 6, 7, 1, 0], [0] * 5, [0] * 5, [2, 3, 4, 5, 1], [9, 10, 11, 12, 1]])
  # 10 tokens + EOS into 5: 6 cut; 4 + EOS fit exactly.
  np.testing.assert_array_equal(encoded.tokens_cut, [0, 0, 0, 6, 0])
  np.testing.assert_array_equal(encoded.present, [True, False, False, True, True])
  np.testing.assert_array_equal(text_lines.encode_lines(lines, VOCABULARY, 5), encoded.rows)
  with pytest.raises(ValueError, match=r"^in.txt:2: cannot encode '5 x'"):
    text_lines.encode_inputs(["5", "5 x"], VOCABULARY, 5, source="in.txt")


def test_truncation_warning_is_one_line_naming_the_first_few():
  assert text_lines.truncation_warning(np.zeros(4, int), "in.txt", 16) is None
  assert text_lines.truncation_warning(np.array([0, 1, 0]), "in.txt", 16) == (
      "warning: in.txt: 1 input longer than the input length 16 (EOS included) truncated: "
      "line 2 (1 token cut)")
  cut = np.zeros(100, int)
  cut[[3, 10, 20, 30, 40, 50, 60, 99]] = [2, 1, 1, 1, 1, 1, 1, 7]
  warning = text_lines.truncation_warning(cut, "in.txt", 16)
  assert "\n" not in warning
  assert warning.startswith("warning: in.txt: 8 inputs longer than the input length 16")
  assert warning.endswith("line 4 (2 tokens cut), line 11 (1 token cut), line 21 (1 token cut), "
                          "line 31 (1 token cut), line 41 (1 token cut) and 3 more")


def test_output_lines_keep_one_line_per_input_and_mark_empty_ones():
  encoded = text_lines.encode_inputs(["5 6", "", "7 8 9 10 11 12"], VOCABULARY, length=4)
  records = [Decoded((6, 5), -0.5, 3, 0.25, 0.125), Decoded((12, 11), -2.0, 3, 1.5, 0.5)]
  texts, scores = inference.output_lines(encoded, records, VOCABULARY,
                                         with_mutual_information=True)
  assert texts == ["6 5", "", "12 11"]
  assert scores == [
      {"line": 1, "empty": False, "output": "6 5", "log_prob": -0.5, "num_tokens": 3,
       "entropy": 0.25, "mutual_information": 0.125, "input_tokens_cut": 0},
      {"line": 2, "empty": True, "output": "", "log_prob": None, "num_tokens": 0,
       "entropy": None, "mutual_information": None, "input_tokens_cut": 0},
      {"line": 3, "empty": False, "output": "12 11", "log_prob": -2.0, "num_tokens": 3,
       "entropy": 1.5, "mutual_information": 0.5, "input_tokens_cut": 3}]
  _, scores = inference.output_lines(encoded, records, VOCABULARY, with_mutual_information=False)
  assert [s["mutual_information"] for s in scores] == [None, None, None]
  with pytest.raises(ValueError, match="1 records for 2 non-empty inputs"):
    inference.output_lines(encoded, records[:1], VOCABULARY, with_mutual_information=True)


def _fresh_params(model_dir, model, data, partitioner, step=None):
  """``restore_params`` without a checkpoint: initial parameters, placed as restored ones."""
  del model_dir, step
  shapes = data.input_shapes()
  state, _ = partitioner.init(
      lambda key: {"params": model.get_initial_variables(key, shapes)["params"]},
      jax.random.key(0))
  return state["params"], 0


def test_infer_writes_a_line_and_a_score_per_input_line(tmp_path, monkeypatch, capsys):
  # Decoding is what is tested here (restoring: tests/training/test_train_in_process.py).
  monkeypatch.setattr(context, "restore_params", _fresh_params)
  monkeypatch.setattr(context, "as_trained", lambda model, *args: model)
  model = EncoderDecoderModel(preset_config("tiny", deterministic=True), num_train_units=1)
  long = " ".join(str(i) for i in range(2, 22))  # 20 tokens + EOS into 16: 5 cut
  lines = ["5 6 7 8", "", long, "   "] + [f"{i} {i + 1} {i + 2}" for i in range(2, 11)]
  inputs, outputs = tmp_path / "in.txt", tmp_path / "out" / "out.txt"
  inputs.write_text("\n".join(lines) + "\n")

  written = inference.infer(
      model_dir=str(tmp_path / "run"), model=model,
      data=TaskData("synthetic_reverse", {"inputs": 16, "targets": 16}, batch_size=8),
      input_file=str(inputs), output_file=str(outputs), decode_method="greedy")
  out, err = capsys.readouterr()

  assert written == len(lines) == 13
  texts = outputs.read_text().split("\n")
  assert len(texts) == len(lines) + 1 and texts[-1] == ""  # one line each, newline-terminated
  assert texts[1] == texts[3] == ""
  scores = [json.loads(line) for line in
            (tmp_path / "out" / "out.txt.scores.jsonl").read_text().splitlines()]
  assert [s["line"] for s in scores] == list(range(1, len(lines) + 1))
  assert [s["empty"] for s in scores] == [False, True, False, True] + [False] * 9
  assert [s["output"] for s in scores] == texts[:-1]
  assert [s["input_tokens_cut"] for s in scores] == [0, 0, 5] + [0] * 10
  for s in scores:
    assert s["mutual_information"] is None  # a deterministic model: no model average
    if s["empty"]:
      assert s["log_prob"] is s["entropy"] is None and s["num_tokens"] == 0
    else:
      assert s["log_prob"] <= 0 and s["entropy"] >= 0
      # EOS included, unless the output fills the target length (16).
      assert s["num_tokens"] == min(len(s["output"].split()) + 1, 16)
  assert ("warning: " + str(inputs) + ": 1 input longer than the input length 16 (EOS included) "
          "truncated: line 3 (5 tokens cut)") in err.splitlines()
  # 11 non-empty inputs, 8 a batch: a bar over 2 batches.
  assert "decoding: 100%" in err and "2/2" in err
  assert f"decoded 13 lines of {inputs} (2 empty) into {outputs}" in out
  # One unit: the manifest names both files and the run; the lock is gone.
  unit = inference.read_outputs(outputs)
  assert unit.texts == texts[:-1] and unit.scores == scores
  assert unit.manifest["text"]["lines"] == 13
  assert {k: unit.manifest["run"][k] for k in (
      "checkpoint_step", "predictive", "num_samples", "decode_method", "input_checksum")} == {
          "checkpoint_step": 0, "predictive": "posterior_mean", "num_samples": 0,
          "decode_method": "greedy",
          "input_checksum": "sha256:" + hashlib.sha256(inputs.read_bytes()).hexdigest()}
  assert sorted(os.listdir(outputs.parent)) == [
      "out.txt", "out.txt.manifest.json", "out.txt.scores.jsonl"]


def _score(line, output, log_prob):
  return {"line": line, "empty": False, "output": output, "log_prob": log_prob,
          "num_tokens": len(output.split()) + 1, "entropy": 0.5, "mutual_information": None,
          "input_tokens_cut": 0}


def _write(output, outputs, **run):
  """``write_outputs`` of ``outputs`` (text -> log_prob) with a run of ``run``."""
  inference.write_outputs(output, list(outputs),
                          [_score(i, t, p) for i, (t, p) in enumerate(outputs.items(), 1)], run)


def _unit(output):
  return {p.name: p.read_bytes() for p in output.parent.iterdir()}


def test_read_outputs_refuses_text_and_scores_of_two_runs(tmp_path):
  first, second = tmp_path / "a" / "out.txt", tmp_path / "b" / "out.txt"
  first.parent.mkdir()
  second.parent.mkdir()
  _write(first, {"3 2": -0.25, "": float("nan")}, model_dir="runs/a", decode_method="beam")
  _write(second, {"9 8": -1.5, "7": -2.0}, model_dir="runs/b", decode_method="sample")

  read = inference.read_outputs(first)
  assert read.texts == ["3 2", ""]
  assert [s["log_prob"] for s in read.scores] == [-0.25, None]  # strict JSON: NaN is null
  assert "NaN" not in (tmp_path / "a" / "out.txt.scores.jsonl").read_text()
  assert read.manifest["run"] == {"model_dir": "runs/a", "decode_method": "beam"}
  assert read.manifest["text"]["file"] == "out.txt"
  assert read.manifest["scores"]["file"] == "out.txt.scores.jsonl"

  # The second run's scores beside the first run's text.
  scores = tmp_path / "a" / "out.txt.scores.jsonl"
  scores.write_bytes((tmp_path / "b" / "out.txt.scores.jsonl").read_bytes())
  got = "sha256:" + hashlib.sha256(scores.read_bytes()).hexdigest()
  with pytest.raises(ValueError) as error:
    inference.read_outputs(first)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"{first}: {scores} is not the file its manifest "
                            f"{first}.manifest.json names (checksum {got}, manifest sha256:")
  assert message.endswith("): text and scores of different runs, or an interrupted write; run "
                          "infer again")
  # ... and its text, with its own scores, beside the first run's manifest.
  first.write_bytes(second.read_bytes())
  with pytest.raises(ValueError, match=rf"^{first}: {first} is not the file its manifest"):
    inference.read_outputs(first)
  os.remove(f"{first}.manifest.json")
  with pytest.raises(ValueError, match=rf"^{first}: no manifest {first}.manifest.json, so not "
                                       "the complete outputs of one infer"):
    inference.read_outputs(first)


def test_an_interrupted_write_leaves_the_previous_unit_or_none_readable_as_complete(
    tmp_path, monkeypatch):
  output = tmp_path / "out.txt"
  _write(output, {"3 2": -0.25}, model_dir="runs/previous")
  previous = _unit(output)
  rename = os.replace

  def failing_on(suffix):
    def replace(source, target):
      if str(target).endswith(suffix):
        raise OSError(f"disk full renaming {target}")
      rename(source, target)
    return replace

  # Interrupted before the renames: the previous unit stays, whole.
  monkeypatch.setattr(os, "replace", failing_on("out.txt"))
  with pytest.raises(OSError, match="disk full"):
    _write(output, {"9 8": -1.5, "7": -2.0}, model_dir="runs/next")
  assert _unit(output) == previous  # no partial file left either
  assert inference.read_outputs(output).manifest["run"] == {"model_dir": "runs/previous"}

  # Interrupted at the last rename (the manifest's): new text and scores, which the
  # previous manifest does not name, so nothing reads as complete.
  monkeypatch.setattr(os, "replace", failing_on(".manifest.json"))
  with pytest.raises(OSError, match="disk full"):
    _write(output, {"9 8": -1.5, "7": -2.0}, model_dir="runs/next")
  assert sorted(_unit(output)) == sorted(previous)
  assert output.read_text() == "9 8\n7\n"
  with pytest.raises(ValueError, match=rf"^{output}: {output} is not the file its manifest "):
    inference.read_outputs(output)

  monkeypatch.setattr(os, "replace", rename)
  _write(output, {"9 8": -1.5, "7": -2.0}, model_dir="runs/next")
  assert inference.read_outputs(output).texts == ["9 8", "7"]


def test_a_second_infer_to_a_held_output_stops_with_one_line_and_leaves_it_intact(
    tmp_path, monkeypatch):
  def restore_params(*args, **kwargs):
    raise AssertionError("infer went past the lock: it would decode and write")

  monkeypatch.setattr(context, "restore_params", restore_params)
  inputs, output = tmp_path / "in.txt", tmp_path / "out.txt"
  inputs.write_text("5 6 7\n")
  first = {"out.txt": b"7 6 5\n", "out.txt.scores.jsonl": b'{"line": 1}\n',
           "out.txt.manifest.json": b"{}\n"}  # another infer's unit, as far as this one knows
  for name, data in first.items():
    (tmp_path / name).write_bytes(data)
  # The first infer: another live process on this host, holding the output's lock.
  holder = subprocess.Popen(["sleep", "600"])
  lock = tmp_path / "out.txt.lock"
  host = socket.gethostname()
  lock.write_text(json.dumps({"host": host, "pid": holder.pid, "started": "2024-05-01 10:00:00 UTC",
                              "token": "first-infer", "heartbeat": time.time()}))
  try:
    with pytest.raises(RuntimeError) as error:
      inference.infer(
          model_dir=str(tmp_path / "run"),
          model=EncoderDecoderModel(preset_config("tiny", deterministic=True), num_train_units=1),
          data=TaskData("synthetic_reverse", {"inputs": 16, "targets": 16}, batch_size=8),
          input_file=str(inputs), output_file=str(output), decode_method="greedy")
    assert str(error.value) == (
        f"infer: OUTPUT_FILE {output} is being written by another infer (host {host}, pid "
        f"{holder.pid}, started 2024-05-01 10:00:00 UTC; lock {lock}); wait for it to finish or "
        "stop it, or give another OUTPUT_FILE (the lock of a process that is gone is taken over)")
    assert {name: (tmp_path / name).read_bytes() for name in first} == first
    assert json.loads(lock.read_text())["token"] == "first-infer"
  finally:
    holder.kill()
    holder.wait()
  # Its process gone, the lock is stale: the next infer takes it over.
  taken, note = inference.lock_output(output)
  assert note == (f"took over the lock of a run that is gone (host {host}, pid {holder.pid}, "
                  f"started 2024-05-01 10:00:00 UTC: no process {holder.pid} of that run on "
                  "this host)")
  assert json.loads(lock.read_text())["pid"] == os.getpid()
  taken.release()
  assert sorted(os.listdir(tmp_path)) == ["in.txt", *sorted(first)]


def test_infer_takes_evals_predictive_methods_checked_before_anything_loads(tmp_path):
  """``infer(method=...)``: eval's methods (``evaluation.methods``), an unknown one a
  one-line ValueError naming them before any file is read or written."""
  inputs = tmp_path / "in.txt"
  inputs.write_text("5 6 7\n")
  with pytest.raises(ValueError, match=r"^predictive method 'mc_dropot' is not one of .*"
                                       r"mc_dropout.*; did you mean mc_dropout\?$"):
    inference.infer(
        model_dir=str(tmp_path / "run"),
        model=EncoderDecoderModel(preset_config("tiny", deterministic=True), num_train_units=1),
        data=TaskData("synthetic_reverse", {"inputs": 16, "targets": 16}, batch_size=8),
        input_file=str(inputs), output_file=str(tmp_path / "out.txt"), method="mc_dropot")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
