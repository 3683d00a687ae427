"""Out-of-distribution sets: their inputs, and the uncertainty measures of their outputs
beside those of as many in-domain sources (like with like)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshbayes import predictive
from meshbayes.data import paths
from meshbayes.data.pipeline import get_task
from meshbayes.data.text_lines import encode_lines, in_batches, read_lines
from meshbayes.evaluation import items
from meshbayes.evaluation.context import EvalRun
from meshbayes.evaluation.decode_passes import BeamMeasures
from meshbayes.evaluation.decoding import Decoded, decode_and_score
from meshbayes.evaluation.predictives import Predictive
from meshbayes.evaluation.settings import OodConfig
from meshbayes.evaluation.sources import Sources

# The passes of a set decoded by beam search as the split is (``OodConfig.beam_sets``).
BEAM_SET_PASSES = (BeamMeasures(),)


def shuffled_words(texts: Sequence[str], seed: int) -> list[str]:
  """Each text with its words in a random order."""
  rng = np.random.default_rng(seed)
  return [" ".join(rng.permutation(text.split())) for text in texts]


def ood_inputs(settings: OodConfig, sources: Sources) -> dict[str, list[str]]:
  """Each set's inputs (at most ``max_examples``), in ``settings.set_names``' order."""
  limit = settings.max_examples
  inputs = {name: read_lines(paths.data_dir() / path, skip_empty=True)[:limit]
            for name, path in settings.files.items()}
  if settings.targets_as_inputs:
    inputs["targets_as_inputs"] = list(dict.fromkeys(
        r for refs in sources.references for r in refs))[:limit]
  if settings.shuffled_words:
    inputs["shuffled_words"] = shuffled_words(sources.texts[:limit], seed=0)
  return inputs


def ood_scores(run: EvalRun, sources: Sources, headline: Predictive, settings: OodConfig,
               decoded: Sequence[Decoded] = (), beam_size: int = 4) -> items.OodScores | None:
  """The headline predictive's uncertainty measures of greedy outputs for as many in-domain
  sources as out-of-distribution inputs, and of each set; None without a set.

  Each of ``settings.beam_sets`` is also decoded by beam search (``beam_size``) with the
  beam-level measures (``BEAM_SET_PASSES``), set against those of ``decoded`` (the split's
  sources as the headline decoded them, in order) for the same in-domain sources."""
  sets = ood_inputs(settings, sources)
  if not sets:
    return None
  data = run.data
  input_vocabulary = get_task(data.task).output_features["inputs"].vocabulary

  def measures(lines: Sequence[str], name: str, **beam: Any) -> dict[str, np.ndarray]:
    method = "beam" if beam else "greedy"
    batches = in_batches(encode_lines(lines, input_vocabulary, data.feature_lengths["inputs"],
                                      source=name), data.batch_size)
    records = decode_and_score(
        run.decoding(headline, method=method, **beam),
        run.progress.track(batches, f"decoding {name} ({method})",
                           math.ceil(len(lines) / data.batch_size)),
        BEAM_SET_PASSES if beam else ())
    return _measures(records, beam_only=bool(beam))

  in_domain = sources.texts[:settings.max_examples]
  scores = items.OodScores(measures(in_domain, data.task),
                           {name: measures(lines, name) for name, lines in sets.items()})
  if settings.beam_sets:
    if len(decoded) < len(in_domain):
      raise ValueError(f"ood_scores: beam_sets={list(settings.beam_sets)} need the split's "
                       f"first {len(in_domain)} decoded sources; got {len(decoded)}")
    scores.in_domain.update(_measures(decoded[:len(in_domain)], beam_only=True))
    for name in settings.beam_sets:
      scores.out_of_domain[name].update(measures(sets[name], name, beam_size=beam_size))
  return scores


def _measures(records: Sequence[Decoded], beam_only: bool) -> dict[str, np.ndarray]:
  """Each measure of ``records`` (only the beam-level ones with ``beam_only``) as arrays."""
  return {m: np.array([r.measures[m] for r in records]) for m in records[0].measures
          if not beam_only or m in predictive.BEAM_MEASURES}
