"""The experiment's commands keep their paths (``python -m meshbayes.tools.NAME``, as the
Makefile and docs call them), each a front-end of the package (each answers --help:
tests/tools/test_commands.py)."""

import subprocess
import sys


def test_the_verdicts_of_a_directory_without_an_experiment_are_a_one_line_error(tmp_path):
  done = subprocess.run([sys.executable, "-m", "meshbayes.tools.experiment_verdicts",
                         str(tmp_path)], capture_output=True, text=True, check=False)
  assert done.returncode == 2
  assert done.stderr.splitlines()[-1] == (
      f"experiment_verdicts.py: error: {tmp_path} holds no experiment (no budget.json)")
