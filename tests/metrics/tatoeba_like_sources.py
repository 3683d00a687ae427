"""Sources shaped like the Tatoeba en-fr test split, with a known truth: the population the
sequence calibration simulations draw from (test_sequence_directions, test_sequence_power).

2,000 sources with the test split's distinct references per source (1,375 with one, 486
with two, ..., one with 16: 2,950 in all) and a fixed true probability ``q`` of each
source's output, the Beta(0.2, 5.8) quantiles paired with the counts by a fixed
permutation: about 91 exact-match and 67 reference-fraction positives expected.
"""

import numpy as np
from scipy import stats

# The test split's distinct references per source: {count: sources}.
TEST_SPLIT_REFERENCE_COUNTS = {1: 1375, 2: 486, 3: 45, 4: 65, 5: 5, 6: 14, 7: 1, 8: 5, 12: 3,
                               16: 1}
TRUTH_BETA = (0.2, 5.8)
PAIRING_SEED = 0


def tatoeba_like_sources() -> tuple[np.ndarray, np.ndarray]:
  """``(q, k)`` of the 2,000 sources, two ``(2000,)`` arrays."""
  k = np.repeat(list(TEST_SPLIT_REFERENCE_COUNTS), list(TEST_SPLIT_REFERENCE_COUNTS.values()))
  levels = (np.arange(k.size) + 0.5) / k.size
  q = np.random.default_rng(PAIRING_SEED).permutation(stats.beta.ppf(levels, *TRUTH_BETA))
  return q, k
