"""The grouped settings of an evaluation (T5X style): decoding, predictives, OOD sets, report.

``evaluation.evaluate`` takes one of each; gin binds them (``runs/eval.gin``) and sets
their fields, e.g. ``evaluation.DecodeConfig.method = 'greedy'``. Each checks its values
when built: a bad one is a one-line ValueError before anything is loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from meshbayes.evaluation import methods
from meshbayes.evaluation.decoding import DECODE_OPTIONS
from meshbayes.field_checks import booleans, is_int, positive_ints
from meshbayes.metrics import bootstrap, calibration, equivalence

DECODE_METHODS = tuple(DECODE_OPTIONS)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Whether and how the split's sources are decoded.

  Attributes:
    enabled: decode the split (BLEU, sequence calibration, error detection, OOD);
      False: teacher-forced figures only.
    method: ``beam``, ``greedy`` or ``sample``.
    beam_size: beams for ``beam``.
    sample_agreement: also decode with each of the model average's samples alone
      and report ``bleu_disagreement`` (100 minus their mean pairwise sentence
      BLEU) among the uncertainty measures, OOD report included (``S`` more
      decodes of every input).
  """

  enabled: bool = True
  method: str = "beam"
  beam_size: int = 4
  sample_agreement: bool = False

  def __post_init__(self):
    booleans("DecodeConfig", self, "enabled", "sample_agreement")
    if self.method not in DECODE_METHODS:
      raise ValueError(f"DecodeConfig: method={self.method!r} must be one of "
                       f"{', '.join(DECODE_METHODS)}")
    positive_ints("DecodeConfig", self, "beam_size")


@dataclasses.dataclass(frozen=True)
class PredictiveConfig:
  """Which predictive distributions are evaluated.

  Attributes:
    method: the predictive method (``meshbayes.evaluation.methods``; None: the run
      as trained, or ``ensemble`` with ``ensemble_dirs``). ``mc_dropout`` evaluates a
      deterministic model's model average over ``num_samples`` dropout masks (each
      shared by a sentence's positions, attention-weight dropout off) and its plain
      self as the posterior mean; ``laplace`` a last-layer Laplace approximation.
    num_samples: members of a posterior's model average (0: the posterior mean only).
    ensemble_dirs: more runs of the same deterministic model (other seeds): with
      them, ``MODEL_DIR``'s run and these are evaluated as one deep ensemble, a
      uniform mixture (``num_samples`` > 0; all members are averaged).
    temperature_scaling: also evaluate every predictive temperature-scaled: each its
      own temperature, fitted by teacher-forced NLL on ``temperature_split``
      (``evaluation.predictives.fit_temperature``), applied to token probabilities
      and to the scores of the unscaled predictive's outputs (it translates the
      same); reported as ``<predictive>_temperature_scaled``.
    temperature_split: the split the temperature is fitted on.
    seed: seed of weight samples and sampling.
    beam_measures: with beam search, also score every hypothesis of the beam under the
      model average's weight samples and report Malinin and Gales's importance-weighted
      ``beam_`` measures (``meshbayes.predictive.beam_sequence_measures``) among the
      uncertainty measures (``beam_size - 1`` more scoring passes of each decoded batch).
    equivalence_samples: ``K`` ancestral samples per source (0: off; at most
      ``metrics.equivalence.MAX_SAMPLES`` = 16) for the equivalence-class sequence
      confidence ``c(y)`` (``metrics.equivalence``): ``p(y)`` plus the probabilities of the
      distinct samples equivalent to ``y``, a lower bound on the probability of ``y``'s
      class, reported per equivalence as ``equivalence_<name>_*`` figures. Cost per decoded
      batch: one sampled decode of ``K`` rows per input (about ``K`` greedy decodes) and
      ``K`` scoring passes (each ``S`` forward passes for a model average); a
      temperature-scaled predictive rescores its unscaled self's samples (``K`` scoring
      passes, no decode).
  """

  method: str | None = None
  num_samples: int = 4
  ensemble_dirs: Sequence[str] = ()
  temperature_scaling: bool = False
  temperature_split: str = "validation"
  seed: int = 0
  beam_measures: bool = False
  equivalence_samples: int = 0

  def __post_init__(self):
    if self.method is not None:
      methods.get(self.method)  # one line naming the registered methods
    positive_ints("PredictiveConfig", self, "num_samples", allow_zero=True)
    positive_ints("PredictiveConfig", self, "seed", allow_zero=True)
    booleans("PredictiveConfig", self, "temperature_scaling", "beam_measures")
    if not is_int(self.equivalence_samples) or not (
        0 <= self.equivalence_samples <= equivalence.MAX_SAMPLES):
      raise ValueError(f"PredictiveConfig: equivalence_samples={self.equivalence_samples!r} "
                       f"must be an int from 0 (off) to {equivalence.MAX_SAMPLES}")
    if isinstance(self.ensemble_dirs, str):
      raise ValueError(f"PredictiveConfig: ensemble_dirs={self.ensemble_dirs!r} must be a list "
                       "of run directories, not one string")
    object.__setattr__(self, "ensemble_dirs", tuple(self.ensemble_dirs))
    if self.ensemble_dirs and not methods.get(self.method_name).combines_runs:
      raise ValueError(f"PredictiveConfig: ensemble_dirs are given but method={self.method!r} "
                       "predicts with one run; drop them or use method='ensemble'")

  @property
  def method_name(self) -> str | None:
    """The method evaluated: ``method``, ``ensemble`` with ``ensemble_dirs``, or None."""
    return self.method or ("ensemble" if self.ensemble_dirs else None)


@dataclasses.dataclass(frozen=True)
class OodConfig:
  """The out-of-distribution inputs told apart from the split's by each uncertainty measure.

  Attributes:
    files: name -> text file of out-of-distribution inputs, one per line (relative
      paths are relative to the data directory, ``make data``'s).
    targets_as_inputs: also use the split's references (the target language: French
      for an English-French model) as inputs, a set models tend to copy confidently.
    shuffled_words: also use the split's inputs with their words shuffled.
    max_examples: at most this many inputs per set, and in-domain sources to compare
      them with (each decoded greedily).
    beam_sets: sets also decoded as the split's sources are (its beam search, with
      ``PredictiveConfig.beam_measures``), whose beam-level measures are set against
      those of the split's first ``max_examples`` decoded sources (like with like).
  """

  files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  targets_as_inputs: bool = False
  shuffled_words: bool = False
  max_examples: int = 1000
  beam_sets: Sequence[str] = ()

  def __post_init__(self):
    if not isinstance(self.files, Mapping):
      raise ValueError(f"OodConfig: files={self.files!r} must map set names to text files")
    booleans("OodConfig", self, "targets_as_inputs", "shuffled_words")
    positive_ints("OodConfig", self, "max_examples")
    if isinstance(self.beam_sets, str) or not all(s in self.set_names for s in self.beam_sets):
      raise ValueError(f"OodConfig: beam_sets={self.beam_sets!r} must be a list of the sets "
                       f"{self.set_names}")
    object.__setattr__(self, "beam_sets", tuple(self.beam_sets))

  @property
  def set_names(self) -> list[str]:
    """The sets, in the order they are decoded and reported."""
    return [*self.files, *["targets_as_inputs"] * self.targets_as_inputs,
            *["shuffled_words"] * self.shuffled_words]


@dataclasses.dataclass(frozen=True)
class ReportConfig:
  """How the figures are reported and where they go.

  Attributes:
    num_bins: equal-width calibration bins.
    bootstrap_resamples: resamples of the bootstrap intervals (over sources).
    output_dir: where the results go (default ``MODEL_DIR/eval/<task>``), so that
      several evaluations of one run (checkpoints, methods) coexist.
  """

  num_bins: int = calibration.DEFAULT_NUM_BINS
  bootstrap_resamples: int = bootstrap.DEFAULT_RESAMPLES
  output_dir: str | None = None

  def __post_init__(self):
    positive_ints("ReportConfig", self, "num_bins", "bootstrap_resamples")
