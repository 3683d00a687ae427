"""The scaling and GPU tools as command lines: a bad request is one line; and the one-device
step spec they share (meshbayes.scaling.step_spec). (Every tool answers --help:
tests/tools/test_commands.py.)"""

import importlib.util
import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[2] / "tools"


def _tool(name):
  """The tool's file loaded as a module of its own (as ``python tools/NAME.py`` runs it)."""
  spec = importlib.util.spec_from_file_location(f"tool_{name}", TOOLS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # where dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def test_a_deviceless_compile_request_that_is_not_json_is_one_line(capsys):
  tool = _tool("deviceless_compile")
  for request, message in (('{"spec": {', "is not JSON"),
                           ('{"spec": {}}', "lacks target_config, hlo: give a JSON object")):
    with pytest.raises(SystemExit) as done:
      tool.main([request])
    assert done.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("deviceless_compile.py: error: request=") and message in error


def test_the_shared_step_spec_is_one_device_and_overrides_win():
  from meshbayes.scaling.step_spec import step_spec
  spec = step_spec("tiny", 4, 16, deterministic=False, dtype="bfloat16", remat_policy="none",
                   overrides=(("dtype", "float32"), ("vocab_size", 128)))
  assert (spec.model, spec.batch_size, spec.input_length, spec.target_length) == (
      "tiny", 4, 16, 16)
  assert (spec.model_parallel, spec.partitioning, spec.optimizer) == (1, "data_only", "adamw")
  assert dict(spec.overrides) == {"dtype": "float32", "remat_policy": "none", "vocab_size": 128}
  # The preset's dtype and remat unless given.
  assert step_spec("tiny", 4, 16, deterministic=True, optimizer="ivon").overrides == ()
