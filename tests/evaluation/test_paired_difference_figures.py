"""Which figures a paired difference of two predictives is taken of
(``evaluation.items.paired_differences``): the signed gap, not its test's statistics."""

import math

from meshbayes.evaluation import items as evaluation_items
from tests.evaluation.made_items import make_items


def test_a_difference_of_two_tests_z_or_p_value_is_not_taken():
  better, worse = make_items(1, quality=0.8), make_items(1, quality=0.4)
  own = evaluation_items.figures(better, null_bands=False)
  assert {"fraction_signed_gap_z", "fraction_signed_gap_p_value"} <= set(own)
  difference = evaluation_items.paired_differences(better, worse, num_resamples=50)
  assert not [name for name in difference if name.endswith(("_z", "_p_value"))]
  # The gap itself is differenced: each side's estimate, paired.
  gap = difference["fraction_signed_gap"].estimate
  assert math.isclose(gap, own["fraction_signed_gap"] - evaluation_items.figures(
      worse, null_bands=False)["fraction_signed_gap"], abs_tol=1e-12)
