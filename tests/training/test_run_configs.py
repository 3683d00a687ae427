"""train's grouped settings, and the field checks every settings dataclass uses: a bad value
is one line naming it and what would do."""

import math

import numpy as np
import pytest

from meshbayes import field_checks
from meshbayes.training.run_configs import CheckpointConfig, EvaluationConfig, InputConfig


@pytest.mark.parametrize("build, message", [
    (lambda: CheckpointConfig(period=0), "CheckpointConfig: period=0 must be a positive int"),
    (lambda: CheckpointConfig(keep=0), "CheckpointConfig: keep=0 must be a positive int"),
    (lambda: CheckpointConfig(keep=2.0), "CheckpointConfig: keep=2.0 must be a positive int"),
    (lambda: CheckpointConfig(async_save="no"),
     "CheckpointConfig: async_save='no' must be True or False"),
    (lambda: CheckpointConfig(initial_from_deterministic=True),
     "CheckpointConfig: initial_from_deterministic=True needs an initial_checkpoint (the "
     "deterministic twin's)"),
    (lambda: CheckpointConfig(initial_checkpoint="d", moped_delta=0),
     "CheckpointConfig: moped_delta=0 must be a positive number"),
    (lambda: EvaluationConfig(period=-1),
     "EvaluationConfig: period=-1 must be a non-negative int"),
    (lambda: InputConfig(shards=0), "InputConfig: shards=0 must be a positive int"),
    (lambda: InputConfig(num_microbatches=True),
     "InputConfig: num_microbatches=True must be a positive int"),
])
def test_a_bad_value_is_one_line_naming_it(build, message):
  with pytest.raises(ValueError) as error:
    build()
  assert str(error.value) == message


def test_the_defaults_are_valid_and_none_means_all_or_the_resumed_runs():
  assert CheckpointConfig().period == 100 and CheckpointConfig(keep=None).keep is None
  assert EvaluationConfig().period == 0
  assert InputConfig().shards is None and InputConfig(shards=2).shards == 2


@pytest.mark.parametrize("check, value, message", [
    (field_checks.positive_int, 0, "x=0 must be a positive int"),
    (field_checks.positive_int, True, "x=True must be a positive int"),  # a bool is no count
    (field_checks.positive_int, 2.0, "x=2.0 must be a positive int"),
    (field_checks.positive_number, 0.0, "x=0.0 must be a positive number"),
    (field_checks.positive_number, math.nan, "x=nan must be a positive number"),
    (field_checks.positive_number, "1", "x='1' must be a positive number"),
])
def test_field_checks_refuse(check, value, message):
  with pytest.raises(ValueError) as error:
    check("Owner", "x", value)
  assert str(error.value) == f"Owner: {message}"


def test_field_checks_accept_numpy_scalars_zero_when_allowed_and_none_when_allowed():
  field_checks.positive_int("Owner", "x", np.int64(3))
  field_checks.positive_number("Owner", "x", np.float32(0.5))
  field_checks.positive_int("Owner", "x", 0, allow_zero=True)
  field_checks.positive_number("Owner", "x", 0.0, allow_zero=True)
  with pytest.raises(ValueError, match="Owner: x=-1 must be a non-negative int"):
    field_checks.positive_int("Owner", "x", -1, allow_zero=True)
  settings = InputConfig()  # shards None, num_microbatches 1
  field_checks.positive_ints("Owner", settings, "shards", "num_microbatches", allow_none=True)
  with pytest.raises(ValueError, match="Owner: shards=None must be a positive int"):
    field_checks.positive_ints("Owner", settings, "shards")
