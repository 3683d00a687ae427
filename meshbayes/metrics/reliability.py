"""Reliability diagrams: mean correctness against mean confidence per bin, several models
on one figure.

A curve is any mapping with per-bin ``bin_confidence``, ``bin_accuracy`` and ``bin_count``
(as ``token_calibration_metrics`` and ``reliability_bins`` return). matplotlib is
imported inside the plotting functions, with the Agg backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

Curve = Mapping[str, object]


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _extent(curves: Mapping[str, Curve]) -> float:
  """The smallest square from 0 holding every filled bin's point (at least 0.05)."""
  values = [np.asarray(curve[key], np.float64)[np.asarray(curve["bin_count"]) > 0]
            for curve in curves.values() for key in ("bin_confidence", "bin_accuracy")]
  largest = max((float(v.max()) for v in values if v.size), default=1.0)
  return min(1.0, max(0.05, 1.1 * largest))


def _draw(ax_reliability, ax_count, curves: Mapping[str, Curve], ylabel: str,
          extent: float = 1.0, equal_mass: bool = False) -> None:
  """One reliability panel (lines per model, the diagonal, axes from 0 to ``extent``) over
  its bin-count histogram (equal-width bins; equal-mass bins need none: the panel says
  how many outputs each holds)."""
  ax_reliability.plot([0, extent], [0, extent], linestyle="--", color="gray", linewidth=1,
                      label="perfect calibration")
  num_models = max(len(curves), 1)
  for k, (name, curve) in enumerate(curves.items()):
    confidence = np.asarray(curve["bin_confidence"], np.float64)
    accuracy = np.asarray(curve["bin_accuracy"], np.float64)
    count = np.asarray(curve["bin_count"], np.float64)
    num_bins = count.size
    filled = count > 0  # empty bins have no mean to draw
    line, = ax_reliability.plot(confidence[filled], accuracy[filled], marker="o", label=name)
    if equal_mass:
      continue
    # Bars side by side within each bin, as fractions of the model's total.
    width = 1.0 / num_bins / num_models
    left = np.arange(num_bins) / num_bins + k * width
    ax_count.bar(left, count / max(count.sum(), 1e-12), width=width, align="edge",
                 color=line.get_color(), label=name)
  ax_reliability.set(xlim=(0, extent), ylim=(0, extent), ylabel=ylabel, aspect="equal")
  ax_reliability.legend(loc="upper left", fontsize="small")
  if equal_mass:
    sizes = {int(np.nanmax(np.asarray(c["bin_count"], np.float64))) for c in curves.values()}
    ax_count.axis("off")
    ax_count.text(0.5, 0.5, f"equal-mass bins: about {max(sizes, default=0)} outputs each",
                  ha="center", va="center", transform=ax_count.transAxes)
    ax_reliability.set_xlabel("probability of the output")
    return
  ax_count.set(xlim=(0, extent), xlabel="confidence", ylabel="fraction")


def plot_reliability(curves: Mapping[str, Curve], path: str | os.PathLike,
                     title: str = "", ylabel: str = "accuracy") -> None:
  """Draws one reliability diagram for one or several models and saves it as PNG.

  Args:
    curves: ``{model name: per-bin arrays}``.
    path: the PNG to write.
    title: figure title.
    ylabel: what the y axis measures (``accuracy``, ``BLEU / 100``...).
  """
  plt = _pyplot()
  fig, (ax_reliability, ax_count) = plt.subplots(
      2, 1, figsize=(4.5, 6), gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
  _draw(ax_reliability, ax_count, curves, ylabel)
  ax_reliability.set_title(title)
  fig.tight_layout()
  fig.savefig(path, format="png", dpi=100)
  plt.close(fig)


def plot_token_and_sequence_reliability(results: Mapping[str, Mapping[str, Curve]],
                                        path: str | os.PathLike, title: str = "") -> None:
  """Token-level and sequence-level reliability diagrams side by side, saved as PNG.

  Token level: top-label accuracy in equal-width bins of confidence. Sequence level:
  the exact-match rate in equal-mass bins of the output's probability
  (``metrics.equal_mass_reliability``), the axes zoomed to where the bins lie.

  Args:
    results: ``{model name: {'token': per-bin arrays, 'sequence': per-bin arrays}}``;
      a model lacking one level is left out of that panel.
    path: the PNG to write.
    title: figure title.
  """
  plt = _pyplot()
  fig, axes = plt.subplots(2, 2, figsize=(9, 6), gridspec_kw={"height_ratios": [3, 1]})
  axes[0, 0].sharex(axes[1, 0])
  axes[0, 0].tick_params(labelbottom=False)
  for column, (level, ylabel) in enumerate([("token", "accuracy"),
                                            ("sequence", "exact-match rate")]):
    curves = {name: levels[level] for name, levels in results.items() if level in levels}
    sequence = level == "sequence"
    _draw(axes[0, column], axes[1, column], curves, ylabel,
          extent=_extent(curves) if sequence and curves else 1.0, equal_mass=sequence)
    axes[0, column].set_title("sequence level, by exact match" if sequence else "token level",
                              fontsize="medium")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, format="png", dpi=100)
  plt.close(fig)
