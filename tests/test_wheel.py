"""The built wheel is a library: one distribution whose importable names all live under
``meshbayes``, its presets as package data, its commands working from any directory.

The wheel is built from the repository and installed, without its dependencies,
into a fresh virtual environment outside it; the dependencies (the exact pins,
already installed for the test run) are reached through a path entry rather than
installed again, so the test is offline and takes seconds. Everything then runs
from an empty directory elsewhere, where the repository's folders cannot be imported.
"""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def _run(args, cwd, timeout=600):
  result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONNOUSERSITE="1"))
  assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
  return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
  dist = tmp_path_factory.mktemp("dist")
  _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", str(dist), str(ROOT)], cwd=ROOT)
  (path,) = dist.glob("meshbayes-*.whl")
  return path


@pytest.fixture(scope="module")
def venv_python(wheel, tmp_path_factory) -> Path:
  venv = tmp_path_factory.mktemp("venv")
  _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv)
  python = venv / "bin" / "python"
  _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
        "--no-index", str(wheel)], cwd=venv)
  site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
              cwd=venv).stdout.strip()
  # After the venv's own site-packages, so the wheel's meshbayes is the one imported.
  Path(site, "_meshbayes_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  return python


def test_the_wheel_holds_only_meshbayes(wheel):
  names = zipfile.ZipFile(wheel).namelist()
  top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
  assert top == {"meshbayes"}
  for part in ("models/encoder_decoder.py", "partitioning/partitioner.py", "tools/bench.py",
               "gin_configs/examples/tiny_synthetic_bayesian.gin", "gin_configs/runs/eval.gin"):
    assert f"meshbayes/{part}" in names


def test_installed_names_and_no_old_ones(venv_python, tmp_path):
  code = ("import importlib.util, meshbayes, meshbayes.models, meshbayes.partitioning, "
          "meshbayes.tools.compare_runs, meshbayes.configurables\n"
          "print(meshbayes.__file__)\n"
          "print([n for n in ('models', 'partitioning', 'gin_configs') "
          "if importlib.util.find_spec(n)])")
  out = _run([str(venv_python), "-c", code], cwd=tmp_path).stdout.splitlines()
  assert "site-packages" in out[0] and str(ROOT) not in out[0]
  assert out[1] == "[]"


@pytest.mark.slow  # a training run from the installed wheel; make test checks its contents
def test_train_and_inspect_from_another_directory(venv_python, tmp_path):
  bindings = ["--gin.MODEL_DIR='run'", "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=8",
              "--gin.train.log_period=1",
              "--gin.models.EncoderDecoderModel.num_train_units=450000"]
  train = venv_python.parent / "meshbayes-train"
  _run([str(train), "--gin_file=gin_configs/examples/tiny_synthetic_bayesian.gin", *bindings],
       cwd=tmp_path)
  assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["3"]
  listing = _run([str(venv_python), "-m", "meshbayes.tools.inspect_checkpoint", "list", "run"],
                 cwd=tmp_path).stdout
  assert "step        3" in listing
  # The presets are also found by their name inside gin_configs/.
  _run([str(venv_python), "-m", "meshbayes.train", "--gin_file=examples/tiny_synthetic_bayesian.gin",
        *bindings, "--gin.MODEL_DIR='run2'", "--gin.TRAIN_STEPS=1"], cwd=tmp_path)
  assert (tmp_path / "run2" / "checkpoints" / "1").is_dir()
