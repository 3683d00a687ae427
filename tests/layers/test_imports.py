"""Importing the layer library keeps TensorFlow out of a model's process."""

import subprocess
import sys


def test_importing_layers_does_not_import_tensorflow_until_a_distribution_layer_is_used():
  code = ("import sys, meshbayes.layers as layers; "
          "print('tensorflow' in sys.modules); layers.Normal; "
          "print('tensorflow_probability' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout.split()
  assert out == ["False", "True"]
