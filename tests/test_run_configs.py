"""train's grouped settings: a bad value is one line naming it and what would do."""

import pytest

from meshbayes.run_configs import CheckpointConfig, EvaluationConfig, InputConfig


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
     "CheckpointConfig: moped_delta=0 must be a number > 0"),
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
