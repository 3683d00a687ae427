"""The configuration reference: docs/configuration.md is what the code generates now."""

import dataclasses
import inspect
import types
from pathlib import Path

from meshbayes.tools import config_reference

ROOT = Path(__file__).resolve().parents[2]


def test_committed_reference_is_up_to_date():
  committed = (ROOT / "docs" / "configuration.md").read_text()
  generated = config_reference.generate()
  assert committed == generated, (
      "docs/configuration.md is out of date with the code; regenerate it with "
      f"`{config_reference.COMMAND}` from the repository root")
  # It covers the entry points, every configurable's parameters and the run macros.
  for heading in ("### train", "### evaluate", "### infer", "### data.TaskData",
                  "### models.TransformerConfig", "### partitioning.Partitioner",
                  "### distributed.DistributedOptions"):
    assert f"\n{heading}\n" in generated
  assert ("| `num_samples` | `int` | `0` | 0 decodes a Bayesian model with its posterior mean"
          in generated)
  assert "| `TRAIN_STEPS` | `train.train_steps` | `runs/train.gin`: `%gin.REQUIRED` |" in generated


def test_docstring_parameters_reads_google_style_sections():
  docstring = """Summary line.

  Longer text: not a parameter.

  Args:
    alpha: the first,
      continued here.
    beta (int): typed.
    **options: passed on.

  Returns:
    gamma: not an argument.

  Attributes:
    delta: an attribute.
  """
  assert config_reference.docstring_parameters(inspect.cleandoc(docstring)) == {
      "alpha": "the first, continued here.", "beta": "typed.", "options": "passed on.",
      "delta": "an attribute."}


@dataclasses.dataclass
class _Settings:
  """Toy settings.

  Attributes:
    size: how many.
    names: which ones.
    hidden: not configurable here.
  """

  size: int
  names: list = dataclasses.field(default_factory=lambda: ["a"])
  hidden: float = 0.5


def test_describe_lists_types_defaults_and_descriptions():
  registered = types.SimpleNamespace(wrapped=_Settings, name="_Settings", module="toy",
                                     allowlist=None, denylist=["hidden"])
  described = config_reference.describe(registered)
  assert described.name == "toy._Settings"
  assert described.target == f"{__name__}._Settings" and described.summary == "Toy settings."
  assert described.parameters == (
      config_reference.Parameter("size", "int", None, "how many."),
      config_reference.Parameter("names", "list", "['a']", "which ones."))
  # Registered under its Python module (gin's default), it is named by its name alone.
  function = types.SimpleNamespace(wrapped=config_reference.main, name="main",
                                   module=config_reference.__name__, allowlist=None,
                                   denylist=None)
  assert config_reference.describe(function).name == "main"


def test_preset_macros_lists_definitions_and_bindings(tmp_path):
  (tmp_path / "runs").mkdir()
  (tmp_path / "runs" / "a.gin").write_text(
      "STEPS = %gin.REQUIRED\nMODE = 'fast'\ntrain.steps = %STEPS\ntrain.mode = %MODE\n")
  (tmp_path / "b.gin").write_text("include 'runs/a.gin'\nSTEPS = 10\nLENGTHS = {'x': 1}\n")
  assert config_reference.preset_macros(tmp_path) == [
      config_reference.Macro("LENGTHS", (("b.gin", "{'x': 1}"),), ()),
      config_reference.Macro("MODE", (("runs/a.gin", "'fast'"),), ("train.mode",)),
      config_reference.Macro("STEPS", (("b.gin", "10"), ("runs/a.gin", "%gin.REQUIRED")),
                             ("train.steps",))]
