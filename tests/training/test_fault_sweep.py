"""The fault sweep tool: a short sweep finds no damage and reports one row per case."""

import subprocess
import sys

import pytest

from tests.training.runs import ROOT

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a reference run, two interrupted chains and their resumes (minutes)
def test_a_short_sweep_finds_no_damage(tmp_path):
  table = tmp_path / "table.md"
  result = subprocess.run(
      [sys.executable, "-m", "meshbayes.tools.fault_sweep", f"--out={tmp_path / 'sweep'}",
       "--kills=1", "--sigterms=1", "--sigints=0", "--steps=8", "--sections=kill,signal",
       f"--markdown={table}"], capture_output=True, text=True, timeout=1800, cwd=ROOT)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  rows = table.read_text().splitlines()[2:]
  assert [row.split(" | ")[0] for row in rows if "final state" in row] == [
      "| kill-9 chain 1: final state", "| SIGTERM chain 1: final state"]
  assert all(row.rstrip().endswith("| none |") for row in rows), rows


def test_bad_arguments_are_one_line():
  result = subprocess.run([sys.executable, "-m", "meshbayes.tools.fault_sweep",
                           "--sections=kill,typo"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "fault_sweep: error: --sections='kill,typo' must name some of ('kill', 'signal', "
      "'bad_input') and --steps=200 must be >= 8")
