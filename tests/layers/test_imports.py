"""Importing the layer library keeps TensorFlow out of a model's process."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_importing_layers_does_not_import_tensorflow_until_a_distribution_layer_is_used():
  code = ("import sys, meshbayes.layers as layers; "
          "print('tensorflow' in sys.modules); layers.Normal; "
          "print('tensorflow_probability' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout.split()
  assert out == ["False", "True"]


def test_distribution_layers_load_after_the_data_layer_imported_tensorflow():
  # With TensorFlow already imported, TFP loads its TensorFlow-facing modules too, which
  # need tf-keras: a data pipeline and a distribution layer in one process must both work.
  code = ("import tensorflow, jax.numpy as jnp, meshbayes.layers as layers; "
          "print(layers.Normal().apply({}, jnp.zeros((1, 2))).mean().shape)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == "(1, 1)"
