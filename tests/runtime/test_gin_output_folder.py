"""A ``runs/`` output folder on ``sys.path`` (the repository root under pytest, after
``make demo``) must not stop gin from reading a recipe that includes ``runs/train.gin``."""

import importlib

import gin

from meshbayes import configurables  # noqa: F401  (registers the configurables)
from meshbayes.gin_configs import DIRECTORY as GIN_CONFIGS


def test_a_runs_folder_on_the_path_does_not_shadow_the_run_settings(tmp_path, monkeypatch):
  (tmp_path / "runs" / "demo").mkdir(parents=True)  # a namespace package "runs"
  monkeypatch.syspath_prepend(str(tmp_path))
  importlib.invalidate_caches()
  assert importlib.util.find_spec("runs").origin is None
  gin.clear_config()
  try:
    gin.add_config_file_search_path(str(GIN_CONFIGS))
    gin.parse_config_files_and_bindings([str(GIN_CONFIGS / "uncertainty/deterministic.gin")],
                                        ["MODEL_DIR = 'x'", "TRAIN_STEPS = 1"],
                                        skip_unknown=True)
    assert gin.query_parameter("%TRAIN_STEPS") == 1
  finally:
    gin.clear_config()
