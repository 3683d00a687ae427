"""Run and data paths: URIs such as gs://bucket/run stay URIs, on a fake bucket.

``fake_gcs`` routes ``etils.epath``'s ``gs://`` through the local file system
(``gs://bucket/x`` is ``<tmp>/gs:/bucket/x``): what the trainer, the metrics
writer, the checkpoint lookup and the data cache do through epath runs for
real. Orbax's array writes go through tensorstore's own GCS driver, which
cannot be faked offline, so a whole training run on gs:// is not tested here.
"""

import json

import pytest
from etils import epath
from etils.epath import gpath

from meshbayes.training import checkpoints, trainer
from meshbayes.data import paths, pipeline
from meshbayes.runtime.metrics_writer import MetricsWriter
from tests.training.runs import events


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
  """``gs://...`` paths read and written under ``tmp_path / 'gs:'``."""
  # Else epath sends gs:// to TensorFlow's GCS file system. ($EPATH_USE_TF=false says the
  # same, but epath reads it once per process.)
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
  monkeypatch.chdir(tmp_path)
  with epath.testing.mock_epath():
    yield tmp_path / "gs:" / "bucket"


def test_uris_are_kept_and_local_paths_made_absolute(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  assert str(checkpoints.as_path("gs://bucket/run")) == "gs://bucket/run"
  assert str(checkpoints.as_path("gs://bucket/run") / "checkpoints") == \
      "gs://bucket/run/checkpoints"
  assert checkpoints.as_path("run") == tmp_path / "run"
  monkeypatch.setenv("MESHBAYES_DATA_DIR", "gs://bucket/data")
  assert str(paths.vocabulary_path("tatoeba_en-fr")) == \
      "gs://bucket/data/vocabularies/tatoeba_en-fr.model"


def test_checkpoints_are_found_in_a_bucket(fake_gcs):
  (fake_gcs / "run" / "checkpoints" / "4" / "state").mkdir(parents=True)
  (fake_gcs / "run" / "checkpoints" / "8" / "state").mkdir(parents=True)
  (fake_gcs / "run" / "checkpoints" / "12.orbax-checkpoint-tmp").mkdir()
  assert str(checkpoints.find_step_dir("gs://bucket/run")) == "gs://bucket/run/checkpoints/8"
  assert str(checkpoints.find_step_dir("gs://bucket/run/checkpoints", 4)) == \
      "gs://bucket/run/checkpoints/4"
  (fake_gcs / "run" / "checkpoints" / "8" / "input").mkdir()
  (fake_gcs / "run" / "checkpoints" / "8" / "input" / "shard-00000-of-00001").write_bytes(b"s")
  (fake_gcs / "run" / "checkpoints" / "8" / "input" / "commit_success.txt").write_text("")
  assert checkpoints.read_input_states("gs://bucket/run/checkpoints/8") == {
      "shard-00000-of-00001": b"s"}


def test_metrics_go_to_a_bucket(fake_gcs):
  assert str(trainer._make_model_dir("gs://bucket/run")) == "gs://bucket/run"
  writer = MetricsWriter("gs://bucket/run/train", "gs://bucket/run/metrics.jsonl")
  writer.write(2, {"loss": 4.5})
  writer.write(4, {"loss": 3.25})
  writer.close()
  lines = (fake_gcs / "run" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line) for line in lines] == [{"step": 2, "loss": 4.5},
                                                  {"step": 4, "loss": 3.25}]
  assert events(fake_gcs / "run" / "train") == {("loss", 2): 4.5, ("loss", 4): 3.25}


def test_the_training_split_size_is_read_from_a_bucket_cache(fake_gcs, monkeypatch, capsys):
  monkeypatch.setenv("MESHBAYES_DATA_DIR", "gs://bucket/data")
  lengths = {"inputs": 7, "targets": 5}
  key = pipeline._cache_key("synthetic_reverse", lengths, "tokens", "train")
  (fake_gcs / "data" / "cache").mkdir(parents=True)
  (fake_gcs / "data" / "cache" / "train_set_size.json").write_text(json.dumps({key: 12345}))
  pipeline._count.cache_clear()
  assert pipeline.train_set_size("synthetic_reverse", lengths) == 12345  # not counted
  assert capsys.readouterr().out == (
      "synthetic_reverse/train: 12,345 target tokens (the KL's divisor), from "
      f"gs://bucket/data/cache/train_set_size.json [{key}]\n")


def test_a_model_dir_that_is_a_file_is_one_line(tmp_path):
  (tmp_path / "run").write_text("not a directory")
  with pytest.raises(ValueError) as error:
    trainer._make_model_dir(tmp_path / "run")
  assert str(error.value) == (f"train: MODEL_DIR {tmp_path / 'run'} must be a directory, but "
                              f"{tmp_path / 'run'} is a file")
  with pytest.raises(ValueError, match=f"MODEL_DIR {tmp_path / 'run' / 'sub'} must be a "
                                       f"directory, but {tmp_path / 'run'} is a file"):
    trainer._make_model_dir(tmp_path / "run" / "sub")
