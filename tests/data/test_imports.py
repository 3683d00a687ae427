"""The data layer's gin configurables load without TensorFlow and seqio, so configuration
errors are told before their seconds of import."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

PROBE = """
import sys
import gin
import meshbayes.configurables
gin.get_configurable("data.TaskData"), gin.get_configurable("data.train_set_size")
print(sorted(name for name in ("tensorflow", "seqio") if name in sys.modules))
from meshbayes import data
print(data.IdVocabulary(8).vocab_size, "tensorflow" in sys.modules)
"""


def test_the_configurables_register_without_tensorflow_or_seqio():
  result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          check=True, timeout=300)
  assert result.stdout.splitlines() == ["[]", "8 True"], result.stderr[-2000:]
