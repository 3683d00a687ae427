"""Every command answers ``--help`` with its usage and status 0, and ``python -m
meshbayes.tools`` lists every tool: the tools are found by listing ``tools/``, so a new one
is covered without a change here."""

import subprocess
import sys

import pytest

from tests.training.runs import ROOT, TOOLS

TOOL_NAMES = sorted(path.stem for path in TOOLS.glob("*.py") if not path.stem.startswith("_"))


def _help(module, flag="--help"):
  """``python -m module flag``: (status, stdout and stderr)."""
  done = subprocess.run([sys.executable, "-m", module, flag], capture_output=True, text=True,
                        cwd=ROOT)
  return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_every_tool_answers_help(name):
  status, output = _help(f"meshbayes.tools.{name}")
  assert status == 0 and output.startswith("usage: "), output[-2000:]


@pytest.mark.parametrize("command", ["train", "eval", "infer"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_commands_answer_help_with_their_flags(command, flag):
  status, output = _help(f"meshbayes.{command}", flag)
  assert status == 0, output[-2000:]
  assert output.startswith(f"usage: python -m meshbayes.{command} --gin_file=FILE")
  for named in ("--gin.NAME=VALUE", "--gin_search_paths", "--coordinator_address",
                "--multihost", "--num_cpu_devices", "--heartbeat_timeout_seconds",
                "python -m meshbayes.tools.config_reference", "python -m meshbayes.tools`"):
    assert named in output, named
  entry_point = {"train": "train", "eval": "evaluate", "infer": "infer"}[command]
  assert f"Runs the gin configurable {entry_point!r}" in output


def test_the_tools_are_listed_with_their_docstrings_first_sentence():
  done = subprocess.run([sys.executable, "-m", "meshbayes.tools"], capture_output=True,
                        text=True, cwd=ROOT, timeout=60)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0].startswith("usage: python -m meshbayes.tools NAME")
  listed = {line.split()[0]: line.split(None, 1)[1] for line in lines[3:]}
  assert sorted(listed) == TOOL_NAMES
  assert listed["inspect_checkpoint"] == "Look inside meshbayes checkpoints."
  assert listed["launch_local"] == ("Run a multi-host command as N processes on this machine "
                                    "(CPU devices, loopback only).")


def test_a_tool_runs_through_the_list_and_a_wrong_name_is_one_line():
  done = subprocess.run([sys.executable, "-m", "meshbayes.tools", "prepare_data", "--help"],
                        capture_output=True, text=True, cwd=ROOT, timeout=60)
  assert done.returncode == 0 and "--data_dir" in done.stdout, done.stderr
  done = subprocess.run([sys.executable, "-m", "meshbayes.tools", "nope"],
                        capture_output=True, text=True, cwd=ROOT, timeout=60)
  assert done.returncode == 2 and done.stdout == ""
  assert done.stderr.startswith("meshbayes.tools: error: no tool 'nope'; choose from bench, ")
  assert len(done.stderr.splitlines()) == 1
