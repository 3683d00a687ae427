"""PoissonProcess: log_prob in closed form, thinning's counts, intensity and bound, quadrature."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from meshbayes.layers import PoissonProcess, PoissonProcessDistribution
from meshbayes.layers.poisson_process import quadrature_rule


def _constant(rate):
  return lambda x: jnp.full(x.shape[:-1], rate, jnp.float32)


def _bump(x):
  """30 + 300 exp(-|x - (0.3, 0.6)|^2 / (2 0.1^2)) on the unit square: a peak 11x the floor."""
  squared = jnp.sum(jnp.square(x - jnp.array([0.3, 0.6])), axis=-1)
  return 30.0 + 300.0 * jnp.exp(-squared / (2 * 0.1 ** 2))


def test_constant_rate_log_prob_is_the_closed_form():
  rate, low, high = 7.5, (0.0, -1.0), (2.0, 0.5)   # volume 3
  process = PoissonProcessDistribution(_constant(rate), low=low, high=high, quadrature_order=5)
  rng = np.random.default_rng(0)
  points = rng.uniform(low, high, size=(4, 6, 2)).astype(np.float32)
  mask = np.arange(6) < np.array([[0], [1], [3], [6]])   # 0, 1, 3 and 6 real points
  expected = mask.sum(-1) * math.log(rate) - rate * 3.0
  np.testing.assert_allclose(process.log_prob(points, mask), expected, rtol=1e-6)
  # The padding is ignored wherever it lies; a real point outside the box has density 0.
  outside = points.copy()
  outside[:, 5] = [9.0, 9.0]
  np.testing.assert_allclose(process.log_prob(outside, mask)[:3], expected[:3], rtol=1e-6)
  assert process.log_prob(outside, mask)[3] == -np.inf
  # Without a mask every point is real.
  np.testing.assert_allclose(process.log_prob(points), 6 * math.log(rate) - 22.5, rtol=1e-6)


def test_sample_counts_have_the_poisson_mean_and_variance():
  # 20 per unit on a box of length 1.5: counts Poisson(30). The bound is estimated (1.5 x 20),
  # so a third of the proposals are thinned away.
  process = PoissonProcessDistribution(_constant(20.0), low=(-0.5,), high=(1.0,), max_points=128)
  assert float(process.thinning_bound()) == pytest.approx(30.0)
  assert float(process.truncation_probability()) < 1e-12
  draws = 10_000
  points, mask = jax.jit(lambda key: process.sample(key, (draws,)))(jax.random.key(0))
  assert points.shape == (draws, 128, 1) and mask.shape == (draws, 128)
  counts = np.asarray(mask.sum(-1), np.float64)
  mean, expected = 30.0, 30.0
  # Standard errors of the sample mean, sqrt(lambda / n), and of the sample variance,
  # sqrt((mu_4 - sigma^4) / n) with a Poisson's mu_4 = lambda (1 + 3 lambda).
  assert abs(counts.mean() - mean) < 4.5 * math.sqrt(expected / draws)
  assert abs(counts.var(ddof=1) - expected) < 4.5 * math.sqrt((expected + 2 * expected ** 2)
                                                              / draws)
  kept = np.asarray(points)[np.asarray(mask)]
  assert kept.min() >= -0.5 and kept.max() <= 1.0
  # The kept points come first: the mask is a prefix.
  assert np.all(np.asarray(mask) == (np.arange(128) < counts[:, None]))


def test_thinned_samples_have_the_intensity_of_an_inhomogeneous_rate():
  process = PoissonProcessDistribution(_bump, low=(0.0, 0.0), high=(1.0, 1.0), max_points=768)
  assert float(process.truncation_probability()) < 1e-9  # proposals ~ Poisson(1.5 x 330)
  draws = 2_000
  points, mask = jax.jit(lambda key: process.sample(key, (draws,)))(jax.random.key(1))
  kept = np.asarray(points)[np.asarray(mask)]
  edges = np.linspace(0.0, 1.0, 6)
  observed, _, _ = np.histogram2d(kept[:, 0], kept[:, 1], bins=(edges, edges))
  # Expected counts: the rate integrated over each of the 5 x 5 cells (Gauss-Legendre, 12
  # nodes per axis per cell: exact to ~1e-7 here), times the draws.
  cells = [quadrature_rule((edges[i], edges[j]), (edges[i + 1], edges[j + 1]), 12)
           for i in range(5) for j in range(5)]
  nodes = np.stack([c[0] for c in cells])
  weights = np.stack([c[1] for c in cells])
  expected = draws * np.sum(weights * np.asarray(_bump(jnp.asarray(nodes))), -1).reshape(5, 5)
  # Cell totals over independent draws are independent Poisson counts: chi-square with 25
  # degrees of freedom, rejected at p < 1e-5 (67.2); every cell's z-score within 4.5.
  chi_square = float(np.sum(np.square(observed - expected) / expected))
  assert chi_square < stats.chi2.ppf(1 - 1e-5, 25), chi_square
  assert np.max(np.abs(observed - expected) / np.sqrt(expected)) < 4.5
  # The cells differ 6x in expected count (the peak's cell against a corner's).
  assert expected.max() / expected.min() > 5


# A 1-D bump 400 high, sd 0.0025, centred between two points of the bound's grid (65 points,
# spacing 1 / 64, at the default quadrature_order=32), on a floor of 5: the grid's largest rate is
# 8.03, so the estimated bound is 12.05 while the true peak is 405.
BUMP_FLOOR, BUMP_HEIGHT, BUMP_CENTRE, BUMP_SD = 5.0, 400.0, 32.5 / 64, 0.0025


def _narrow_bump(x):
  return BUMP_FLOOR + BUMP_HEIGHT * jnp.exp(-jnp.square(x[..., 0] - BUMP_CENTRE)
                                            / (2 * BUMP_SD ** 2))


def _bump_integral(cap=math.inf):
  """``integral_0^1 min(_narrow_bump, cap)``, closed form: the mean count at thinning bound cap."""
  # The bump's mass; its tails beyond 0 and 1 (200 sd away) are nothing in float64.
  mass = BUMP_HEIGHT * BUMP_SD * math.sqrt(2 * math.pi)
  if cap >= BUMP_FLOOR + BUMP_HEIGHT:
    return BUMP_FLOOR + mass
  # rate > cap within `half` of the centre: there the integrand is cap; outside, the rate.
  half = BUMP_SD * math.sqrt(2 * math.log(BUMP_HEIGHT / (cap - BUMP_FLOOR)))
  return (cap * 2 * half + BUMP_FLOOR * (1 - 2 * half)
          + mass * special.erfc(half / (BUMP_SD * math.sqrt(2))))


def test_a_rate_above_the_estimated_bound_is_counted_and_checked():
  process = PoissonProcessDistribution(_narrow_bump, low=(0.0,), high=(1.0,), max_points=64)
  bound = float(process.thinning_bound())
  assert bound == pytest.approx(1.5 * 8.0303, rel=1e-4)
  draws = 20_000
  points, mask, diagnostics = jax.jit(
      lambda key: process.sample_with_diagnostics(key, (draws,)))(jax.random.key(2))
  assert diagnostics.exceeded.shape == (draws,)
  assert float(diagnostics.bound) == pytest.approx(bound, rel=1e-6)
  # Proposals are a Poisson process of rate `bound`: those where rate > bound, an interval of
  # length 0.01421 around the peak, are Poisson(bound x 0.01421 = 0.171) per sample.
  half = BUMP_SD * math.sqrt(2 * math.log(BUMP_HEIGHT / (bound - BUMP_FLOOR)))
  expected = bound * 2 * half
  assert expected == pytest.approx(0.1712, rel=1e-3)
  exceeded = np.asarray(diagnostics.exceeded, np.float64)
  assert abs(exceeded.mean() - expected) < 4 * math.sqrt(expected / draws)
  # The largest rate seen is near the peak: rate > 0.95 x 405 within 0.32 sd of the centre,
  # 0.019 proposals per sample there, 388 expected over the draws (none: e^-388).
  assert 0.95 * 405 < float(np.max(diagnostics.max_rate)) <= 405 * (1 + 1e-6)
  # The sample is short by the rate's excess over the bound: its counts have mean
  # integral min(rate, bound) = 5.11, not the integrated rate 7.51 (32% fewer).
  counts = np.asarray(mask.sum(-1), np.float64)
  short, full = _bump_integral(bound), _bump_integral()
  assert short == pytest.approx(5.111, rel=1e-3) and full == pytest.approx(7.507, rel=1e-3)
  assert abs(counts.mean() - short) < 4 * math.sqrt(short / draws)
  # `sample` draws the same points (same key), and the check names the count and the values.
  same_points, same_mask = jax.jit(lambda key: process.sample(key, (draws,)))(jax.random.key(2))
  np.testing.assert_array_equal(same_mask, mask)
  np.testing.assert_array_equal(same_points, points)
  total = int(exceeded.sum())
  largest = float(np.max(diagnostics.max_rate))
  message = (rf"^PoissonProcess.sample: {total} proposals \(in \d+ of {draws} samples\) had rate > "
             rf"the thinning bound {bound:.6g} \(largest rate seen {largest:.6g}\).*pass "
             rf"rate_bound above the rate's maximum \(>= {largest:.6g}\) or a larger "
             r"rate_bound_margin$")
  with pytest.raises(ValueError, match=message):
    diagnostics.check_bound()


@pytest.mark.parametrize("rate_fn, rate_bound, max_points", [
    (_constant(20.0), None, 64),      # estimated bound 30 over a constant 20
    (_constant(20.0), 20.0, 64),      # a bound equal to the rate is exact too
    (_narrow_bump, 420.0, 576),       # the narrow bump under an adequate bound (peak 405)
])
def test_a_rate_within_its_bound_exceeds_it_nowhere(rate_fn, rate_bound, max_points):
  process = PoissonProcessDistribution(rate_fn, low=(0.0,), high=(1.0,), rate_bound=rate_bound,
                                       max_points=max_points)
  _, _, diagnostics = jax.jit(
      lambda key: process.sample_with_diagnostics(key, (500,)))(jax.random.key(3))
  assert np.asarray(diagnostics.exceeded).tolist() == [0] * 500
  assert float(np.max(diagnostics.max_rate)) <= float(diagnostics.bound)
  diagnostics.check_bound()   # does not raise


def test_an_adequate_bound_samples_the_narrow_bump_in_full():
  # rate_bound=420 over the peak 405: proposals Poisson(420), 576 slots (7 sd above).
  process = PoissonProcessDistribution(_narrow_bump, low=(0.0,), high=(1.0,), rate_bound=420.0,
                                       max_points=576)
  assert float(process.truncation_probability()) < 1e-9
  draws = 4_000
  _, mask, diagnostics = jax.jit(
      lambda key: process.sample_with_diagnostics(key, (draws,)))(jax.random.key(4))
  assert int(np.sum(diagnostics.exceeded)) == 0
  # Counts Poisson(7.507), the closed-form integral: the mean within 4 standard errors
  # (0.043), far from the short sampler's 5.11.
  counts = np.asarray(mask.sum(-1), np.float64)
  expected = _bump_integral()
  assert abs(counts.mean() - expected) < 4 * math.sqrt(expected / draws)
  assert abs(counts.var(ddof=1) - expected) < 4.5 * math.sqrt((expected + 2 * expected ** 2)
                                                              / draws)


def _smooth(x):
  """exp(x_0) (2 + cos 3 x_1): its integral on [0, 1] x [0, 2] is (e - 1) (4 + sin(6) / 3)."""
  return jnp.exp(x[..., 0]) * (2.0 + jnp.cos(3.0 * x[..., 1]))


SMOOTH_INTEGRAL = (math.e - 1.0) * (4.0 + math.sin(6.0) / 3.0)


def _integral(rate_fn, order, quadrature, low=(0.0, 0.0), high=(1.0, 2.0)):
  process = PoissonProcessDistribution(rate_fn, low=low, high=high, quadrature=quadrature,
                                       quadrature_order=order)
  return float(jax.jit(process.integrated_rate)())


def test_midpoint_rule_converges_at_second_order():
  errors = [abs(_integral(_smooth, n, "midpoint") - SMOOTH_INTEGRAL) for n in (4, 8, 16, 32)]
  ratios = np.array(errors[:-1]) / np.array(errors[1:])
  # O(h^2): the error quarters each time the cells per axis double (measured 4.09, 4.02, 4.00).
  np.testing.assert_allclose(ratios, 4.0, rtol=0.05)


def test_gauss_legendre_rule_is_exact_to_degree_2n_minus_1():
  for n in (2, 3, 4):
    p = 2 * n - 1
    exact_degree = lambda x, p=p: x[..., 0] ** p * x[..., 1] ** p
    # On [0, 1] x [0, 2] the integral of x^p y^p is 2^(p+1) / (p+1)^2: exact at n nodes.
    assert _integral(exact_degree, n, "gauss_legendre") == pytest.approx(
        2 ** (p + 1) / (p + 1) ** 2, rel=1e-5)
    # Degree 2n is not: the rule's error term, relative (n!)^4 / ((2n)!)^2 for x^(2n) on
    # [0, 1] (2.8e-2, 2.5e-3, 2.0e-4 at n = 2, 3, 4), is what it misses.
    beyond_degree = lambda x, p=2 * n: x[..., 0] ** p
    relative = 1.0 - _integral(beyond_degree, n, "gauss_legendre") * (2 * n + 1) / 2
    assert relative == pytest.approx(math.factorial(n) ** 4 / math.factorial(2 * n) ** 2,
                                     rel=0.02), n
  # On the smooth rate the error falls faster than any fixed power of 1 / n: 274x from 2 to 4
  # nodes per axis (a second-order rule gains 4x), and 8 nodes reach float32's rounding
  # (6e-7 of 6.5), 800x below the midpoint rule's error at 32 cells.
  gl = {n: abs(_integral(_smooth, n, "gauss_legendre") - SMOOTH_INTEGRAL) for n in (2, 4, 8)}
  assert gl[2] / gl[4] > 100
  assert gl[8] < 1e-5 and gl[8] < abs(_integral(_smooth, 32, "midpoint") - SMOOTH_INTEGRAL) / 100


class _SoftplusRate(nn.Module):
  @nn.compact
  def __call__(self, x):
    return 20.0 * jax.nn.softplus(nn.Dense(1)(x))[..., 0]


def test_layer_binds_a_flax_rate_and_its_gradients_flow():
  layer = PoissonProcess(rate=_SoftplusRate(), low=(0.0, 0.0), high=(1.0, 1.0),
                         quadrature_order=8)
  variables = jax.jit(layer.init)(jax.random.key(0))
  points = jnp.array([[[0.1, 0.2], [0.5, 0.5], [0.0, 0.0]]])
  mask = jnp.array([[True, True, False]])

  def log_prob(params):
    return layer.apply({"params": params}, method=lambda m: m().log_prob(points, mask))[0]

  value, grads = jax.jit(jax.value_and_grad(log_prob))(variables["params"])
  dense = variables["params"]["rate"]["Dense_0"]
  rate = lambda x: 20.0 * jax.nn.softplus(x @ dense["kernel"] + dense["bias"])[..., 0]
  reference = PoissonProcessDistribution(rate, low=(0.0, 0.0), high=(1.0, 1.0),
                                         quadrature_order=8).log_prob(points, mask)[0]
  assert float(value) == pytest.approx(float(reference), rel=1e-6)
  leaves = jax.tree.leaves(grads)
  assert len(leaves) == 2 and all(np.all(np.isfinite(g)) and np.any(g != 0) for g in leaves)


@pytest.mark.parametrize("kwargs, message", [
    ({"low": (0.0, 1.0), "high": (1.0, 1.0)}, "high > low"),
    ({"low": (0.0,), "high": (1.0, 2.0)}, "equal length"),
    ({"quadrature": "simpson"}, "gauss_legendre, midpoint"),
    ({"quadrature_order": 0}, "quadrature_order=0"),
    ({"quadrature_order": True}, "quadrature_order=True"),
    ({"max_points": 0}, "max_points=0"),
    ({"max_points": True}, "max_points=True must be a positive int"),
    ({"rate_bound": -1.0}, "rate_bound=-1.0"),
    ({"rate_bound_margin": 0.5}, "rate_bound_margin=0.5"),
])
def test_bad_settings_raise_one_clear_line(kwargs, message):
  with pytest.raises(ValueError, match=message):
    PoissonProcessDistribution(_constant(1.0), **kwargs)


def test_points_of_the_wrong_dimension_raise():
  process = PoissonProcessDistribution(_constant(1.0), low=(0.0, 0.0), high=(1.0, 1.0))
  with pytest.raises(ValueError, match=r"must be \(\.\.\., N, 2\)"):
    process.log_prob(jnp.zeros((5, 3)))
