"""Reliability diagrams are written; the package imports neither TensorFlow nor matplotlib."""

import subprocess
import sys

import numpy as np
import pytest

from meshbayes import metrics


def curves():
  rng = np.random.default_rng(0)
  confidence = rng.random(200)
  deterministic = metrics.reliability_bins(confidence, rng.random(200) < confidence ** 2)
  bayesian = metrics.reliability_bins(confidence, rng.random(200) < confidence)
  return deterministic, bayesian


def is_png(path):
  data = path.read_bytes()
  return len(data) > 1000 and data.startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_reliability_writes_png(tmp_path):
  deterministic, bayesian = curves()
  path = tmp_path / "reliability.png"
  metrics.plot_reliability({"deterministic": deterministic, "bayesian": bayesian}, path,
                           title="token level")
  assert is_png(path)


def test_token_and_sequence_panels_write_png(tmp_path):
  deterministic, bayesian = curves()
  sparse = metrics.equal_mass_reliability([0.05, 0.01, 0.2], [0, 0, 1])  # 3 bins of one
  path = tmp_path / "both.png"
  metrics.plot_token_and_sequence_reliability(
      {"deterministic": {"token": deterministic, "sequence": sparse},
       "bayesian": {"token": bayesian}}, path, title="WMT")
  assert is_png(path)


@pytest.mark.integration
def test_package_imports_neither_tensorflow_nor_matplotlib():
  code = ("import sys, meshbayes.metrics; "
          "bad = [m for m in ('tensorflow', 'matplotlib') if m in sys.modules]; "
          "assert not bad, bad")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
