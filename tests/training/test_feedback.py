"""What a run tells its user: the time left without compilation, and where the training
split's size comes from."""

import io
import json
import re

from meshbayes.runtime import metrics_writer
from meshbayes.data import pipeline, synthetic


def test_the_time_left_excludes_the_compiling_first_step(monkeypatch):
  now = [0.0]
  monkeypatch.setattr(metrics_writer.time, "perf_counter", lambda: now[0])
  stream = io.StringIO()
  bar = metrics_writer.ProgressBar(total_steps=100, start_step=0, stream=stream)
  now[0] = 60.0  # step 1 compiled and ran
  bar.start_clock(1)
  now[0] = 70.0  # then 10 steps of 1 s
  bar.update(11, {"loss": 2.0})
  # 89 steps left at 1 s each; timed from the bar's construction it would say 70/11*89 = 566.
  assert stream.getvalue().rstrip().endswith("~89 s left")


def test_the_cache_key_holds_what_changes_the_count():
  key = lambda lengths, unit="tokens", split="train", task="synthetic_reverse": (
      pipeline._cache_key(task, lengths, unit, split))
  assert key({"inputs": 16, "targets": 8}) == (
      "synthetic_reverse|train|tokens|targets<=8|IdVocabulary:32|data:"
      + pipeline._data_fingerprint("synthetic_reverse", "train"))
  assert key({"inputs": 24, "targets": 8}) == key({"inputs": 16, "targets": 8})  # inputs: no
  assert len({key({"inputs": 16, "targets": 8}), key({"inputs": 16, "targets": 9}),
              key({"inputs": 16, "targets": 8}, split="validation"),
              key({"inputs": 16, "targets": 8}, task="synthetic_copy")}) == 4
  assert key({"inputs": 16, "targets": 8}, "examples") == key({"inputs": 1, "targets": 1},
                                                              "examples")


def test_the_run_says_where_the_training_split_size_came_from(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(tmp_path))
  cache = tmp_path / "cache" / "train_set_size.json"
  key = ("synthetic_reverse|validation|examples|data:"
         + pipeline._data_fingerprint("synthetic_reverse", "validation"))
  count = lambda: pipeline.train_set_size("synthetic_reverse", {"inputs": 8, "targets": 8},
                                          unit="examples", split="validation")  # a small one
  pipeline._count.cache_clear()
  assert count() == synthetic.NUM_EXAMPLES["validation"] == 512
  counting, counted = capsys.readouterr().out.splitlines()
  assert counting == ("counting the examples of synthetic_reverse/validation (the KL's divisor; "
                      "cached afterwards)...")
  assert re.fullmatch(rf"synthetic_reverse/validation: 512 examples \(the KL's divisor\), "
                      rf"counted in [\d.]+ s; cached in {re.escape(str(cache))} "
                      rf"\[{re.escape(key)}\]", counted), counted
  assert json.loads(cache.read_text()) == {key: 512}

  pipeline._count.cache_clear()  # a new run
  assert count() == 512
  assert capsys.readouterr().out == (f"synthetic_reverse/validation: 512 examples (the KL's "
                                     f"divisor), from {cache} [{key}]\n")
