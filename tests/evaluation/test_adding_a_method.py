"""Adding a predictive method as docs/posteriors.md says: a posterior kind, its build and
one registration, all in this file, evaluated through the real command on a tiny run.

The toy kind scales the output projection of each member by 0: every member predicts
uniformly over the vocabulary, so the model average's token NLL is ``log V`` whatever the
run, while its posterior mean is the run's own weights."""

import math
from typing import Any, NamedTuple

import jax
import pytest
from flax import traverse_util

from meshbayes.evaluation import methods
from meshbayes.layers import posteriors
from meshbayes.layers.weight_posterior import drawn_member_keys, drawn_num_members, weights_only
from meshbayes.runtime import strict_json
from tests.training.runs import command, eval_args, train_args, train_or_fail

pytestmark = pytest.mark.integration

NAME = "scaled_output_layer"
OUTPUT_KERNEL = ("decoder", "logits_dense", "kernel")
VOCAB_SIZE = 32  # models/tiny.gin's


@posteriors.register_kind
class ScaledOutputLayer(NamedTuple):
  """The run's weights, each member's output projection scaled by ``SCALE``; the mean is
  the run's weights unscaled. Every member is alike: nothing is drawn."""

  params: Any

  SCALE = 0.0
  external = True
  has_mean = True

  def mean_weights(self) -> Any:
    return self.params

  def sample(self, key: jax.Array) -> Any:
    del key
    flat = traverse_util.flatten_dict(self.params)
    flat[OUTPUT_KERNEL] = flat[OUTPUT_KERNEL] * self.SCALE
    return traverse_util.unflatten_dict(flat)

  member_keys = drawn_member_keys
  num_members = drawn_num_members
  apply_options = weights_only

  def sampled_axes(self) -> Any:
    return jax.tree.map(lambda _: None, self.params)  # the members do not differ

  def stacked(self, keys: jax.Array) -> Any:
    return self.sample(None if keys is None else keys[0])


def scaled_output_layer(model, params, inputs):
  """The method's build: a deterministic run's parameters as ``ScaledOutputLayer``."""
  del inputs
  return model, ScaledOutputLayer(params)


@pytest.fixture
def registered(monkeypatch):
  """The method registered for this test only (the registry as it was afterwards)."""
  monkeypatch.setattr(methods, "_METHODS", dict(methods._METHODS))  # pylint: disable=protected-access
  methods.register(methods.PredictiveMethod(
      NAME, "the run's weights, the output layer scaled by 0", "deterministic",
      scaled_output_layer))
  return NAME


@pytest.fixture(scope="module")
def deterministic_run(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("adding") / "run"
  train_or_fail(train_args(model_dir, 2, kind="deterministic"))
  return model_dir


def test_the_kind_scales_only_the_output_layer():
  params = {"decoder": {"logits_dense": {"kernel": jax.numpy.full((2, 3), 2.0)},
                        "layers": {"w": jax.numpy.ones(2)}}}
  posterior = posteriors.as_posterior(ScaledOutputLayer(params))
  member = posteriors.sample_weights(posterior, jax.random.key(0))
  assert member["decoder"]["logits_dense"]["kernel"].tolist() == [[0.0] * 3] * 2
  assert member["decoder"]["layers"]["w"].tolist() == [1.0, 1.0]
  assert posteriors.posterior_mean(posterior) is params and posteriors.holds_posterior(posterior)


def test_a_method_added_in_one_file_is_evaluated_by_the_eval_command(registered,
                                                                      deterministic_run, capsys):
  code, _, err = command(
      capsys, "evaluate", *eval_args(
          deterministic_run, f"--gin.evaluation.PredictiveConfig.method='{registered}'",
          "--gin.evaluation.PredictiveConfig.num_samples=2",
          "--gin.evaluation.ReportConfig.bootstrap_resamples=10"), model_from_model_dir=True)
  assert code == 0, err[-2000:]
  written = strict_json.loads_strict(
      (deterministic_run / "eval" / "synthetic_reverse" / "metrics.json").read_text())
  assert (written["step"], written["method"]) == (2, NAME)
  assert written["predictives"] == ["model_average", "posterior_mean"]
  calibration = written["token_calibration"]
  # Uniform members: the model average's NLL is log V; the mean is the trained run's.
  assert calibration["model_average"]["nll"] == pytest.approx(math.log(VOCAB_SIZE), rel=1e-5)
  assert abs(calibration["posterior_mean"]["nll"] - math.log(VOCAB_SIZE)) > 0.01
