"""One predictive against calibration, over training seeds: overconfident, underconfident
or calibrated within noise (the design's "One predictive against its band",
docs/results/2026-11-29-sequence-calibration-design.md).

Per predictive, each seed's reference-fraction signed gap (mean label minus mean ``p``,
``metrics.sequence_gap``) is one value; their mean gets a 95% t-interval over the seeds and
a two-sided t-test against 0, and Holm's correction runs over the predictives of the table:
``sequence_gap``'s verdict names from the Holm-adjusted p-value. Beside it, per seed: the
z-test of its gap over the sources (uncorrected) and whether its one-sided
reference-fraction ECE lies above its null band's 97.5% point. These are one-sample tests:
the 400-positive gate (made for telling two models apart) does not apply; their power is
stated instead: the smallest mean gap the seeds' t-test detects with probability 0.8 at
Holm's smallest level, and the smallest miscalibration factor (``p`` = factor x the true
probability) each seed's z-test detects with probability 0.8 at 0.05 (from its realized
standard error; a factor scales the gap by the match rate: gap = (1 - factor) x mean label).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from meshbayes.metrics import bootstrap, multiple_testing, seed_power, sequence_gap
from meshbayes.metrics import measures as registry
from meshbayes.metrics.seed_intervals import t_interval

Values = Mapping[str, Mapping[str, Mapping[int, float]]]  # tables.seed_values'
GAP, Z, P_VALUE = "fraction_signed_gap", "fraction_signed_gap_z", "fraction_signed_gap_p_value"
ECE, BAND_HIGH, MATCH_RATE = "fraction_ece", "fraction_ece_null_high", "reference_fraction"
ABOVE_BAND, WITHIN_BAND = "above its band", "within its band"


def _per_seed(figures: Mapping[str, Mapping[int, float]], seed: int,
              alpha: float) -> dict[str, Any]:
  """One seed's z-test verdict, its ECE against the band and the factors it detects."""
  get = lambda name: figures.get(name, {}).get(seed, math.nan)
  gap, z, p_value = get(GAP), get(Z), get(P_VALUE)
  entry: dict[str, Any] = {"gap": gap, "z": z, "p_value": p_value}
  entry["verdict"] = (sequence_gap.verdict(gap, p_value, alpha)
                      if math.isfinite(gap) and 0.0 <= p_value <= 1.0 else None)
  ece, high = get(ECE), get(BAND_HIGH)
  entry.update(ece=ece, band_high=high, band=(
      None if math.isnan(ece) or math.isnan(high) else ABOVE_BAND if ece > high
      else WITHIN_BAND))
  # The standard error is what the z divided the gap by; the factors scale the match rate.
  detectable = (seed_power.detectable_effect(abs(gap / z), alpha)
                if math.isfinite(z) and z != 0 else math.nan)
  rate = get(MATCH_RATE)
  # Under: NaN where even p = 0 would not be detected.
  entry["factors"] = ([1.0 + detectable / rate,
                       1.0 - detectable / rate if detectable < rate else math.nan]
                      if rate > 0 and math.isfinite(detectable) else [math.nan, math.nan])
  return entry


def band_verdicts(values: Values, alpha: float = multiple_testing.DEFAULT_ALPHA,
                  level: float = bootstrap.DEFAULT_LEVEL) -> dict[str, Any]:
  """Each predictive of ``values`` (``tables.seed_values``) with a signed gap at two seeds
  or more: its mean over seeds with the t-interval and t-test, Holm over the predictives,
  the verdict, the per-seed tests and the power (the module's doc).

  Returns:
    ``{title: {"mean", "holm_p_value", "verdict", "detectable", "positives", "seeds"}}``,
    ``mean`` the ``SeedInterval``'s dict, ``seeds`` ``{seed: _per_seed}``; in the order of
    ``values``.
  """
  rows = {title: figures for title, figures in values.items() if len(figures.get(GAP, {})) >= 2}
  means = {title: t_interval(list(figures[GAP].values()), level)
           for title, figures in rows.items()}
  holm = multiple_testing.holm([1.0 if math.isnan(m.p_value) else m.p_value
                                for m in means.values()], alpha)
  result = {}
  for (title, figures), adjusted in zip(rows.items(), holm.adjusted):
    mean = means[title]
    n = mean.seed_counts[0]
    standard_error = statistics.stdev(figures[GAP].values()) / math.sqrt(n)
    positives = figures.get(registry.positives_figure(GAP), {})
    result[title] = {
        "mean": mean.as_dict(), "holm_p_value": adjusted,
        "verdict": sequence_gap.verdict(mean.estimate, adjusted, alpha),
        "detectable": seed_power.detectable_effect(standard_error, holm.smallest_level,
                                                   df=n - 1),
        "positives": min(positives.values()) if positives else None,
        "seeds": {seed: _per_seed(figures, seed, alpha) for seed in sorted(figures[GAP])}}
  return result


def band_table(values: Values, where: str, alpha: float = multiple_testing.DEFAULT_ALPHA,
               level: float = bootstrap.DEFAULT_LEVEL) -> tuple[str, dict[str, Any]]:
  """``(markdown, summary)`` of ``band_verdicts`` (``where``: the split, for the header);
  empty without a predictive of two seeds."""
  found = band_verdicts(values, alpha, level)
  if not found:
    return "", {}
  scale, spec = registry.get(GAP).scale, registry.get(GAP).format_spec
  signed = lambda x: "-" if math.isnan(x) else format(x * scale, "+" + spec)
  lines = [f"| predictive ({where}) | signed gap (%), mean of seeds [{level:.0%} t] | t-test p "
           f"(Holm over {len(found)}) | verdict | per seed: z-test over the sources | per seed: "
           "reference-fraction ECE (%) against its band's 97.5% point | power |",
           "|---|---|---|---|---|---|---|"]
  for title, row in found.items():
    mean, seeds = row["mean"], row["seeds"].values()
    ece = lambda s: ("-" if s["band"] is None else
                     f"{s['ece'] * scale:{spec}} {'>' if s['band'] == ABOVE_BAND else '<='} "
                     f"{s['band_high'] * scale:{spec}}")
    # The weakest seed's: what every seed detects (NaN: some seed detects none).
    over, under = (_weakest([s["factors"][i] for s in seeds], pick) for i, pick in
                   ((0, max), (1, min)))
    positives = "" if row["positives"] is None else f"; fewest positives {row['positives']:.0f}"
    lines.append(
        f"| {title} ({mean['seed_counts'][0]} seeds) | {signed(mean['estimate'])} "
        f"[{signed(mean['low'])}, {signed(mean['high'])}] | {_number(mean['p_value'])} "
        f"(Holm {_number(row['holm_p_value'])}) | **{row['verdict']}** | "
        + ", ".join(s["verdict"] or "-" for s in seeds) + " | "
        + ", ".join(ece(s) for s in seeds) + " | "
        f"seeds: a mean gap of ±{_unsigned(row['detectable'] * scale, spec)}; each seed: "
        f"{_unsigned(over, '.2f')}x over, {_unsigned(under, '.2f')}x under{positives} |")
  return "\n".join(lines), found


def _weakest(factors: list[float], pick) -> float:
  return math.nan if not factors or any(math.isnan(f) for f in factors) else pick(factors)


def _number(value: float) -> str:
  return "-" if math.isnan(value) else format(value, ".2g")


def _unsigned(value: float, spec: str) -> str:
  return "-" if math.isnan(value) else format(value, spec)
