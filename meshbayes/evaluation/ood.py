"""Out-of-distribution sets: their inputs, and the uncertainty measures of their outputs
beside those of as many in-domain sources (like with like)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from meshbayes.data import paths
from meshbayes.data.pipeline import TaskData, get_task
from meshbayes.evaluation import items, phases, predictives
from meshbayes.evaluation.settings import OodConfig
from meshbayes.evaluation.sources import Sources
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner
from meshbayes.data.text_lines import encode_lines, in_batches, read_lines


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


def ood_scores(model: BaseModel, params: Any, data: TaskData, sources: Sources,
               partitioner: Partitioner, headline: predictives.Predictive, rng: jax.Array,
               progress: phases.EvalPhases, settings: OodConfig) -> items.OodScores | None:
  """The headline predictive's uncertainty measures of greedy outputs for as many in-domain
  sources as out-of-distribution inputs, and of each set; None without a set."""
  sets = ood_inputs(settings, sources)
  if not sets:
    return None
  input_vocabulary = get_task(data.task).output_features["inputs"].vocabulary
  length = data.feature_lengths["inputs"]

  def measures(lines: Sequence[str], name: str) -> dict[str, np.ndarray]:
    batches = in_batches(encode_lines(lines, input_vocabulary, length, source=name),
                         data.batch_size)
    records = predictives.decode_and_score(
        model, params, progress.track(batches, f"decoding {name} (greedy)",
                                      math.ceil(len(lines) / data.batch_size)),
        partitioner, headline, rng, max_length=data.feature_lengths["targets"],
        eos_id=data.vocabulary.eos_id, method="greedy")
    return {m: np.array([r.measures[m] for r in records]) for m in records[0].measures}

  in_domain = sources.texts[:settings.max_examples]
  return items.OodScores(measures(in_domain, data.task),
                         {name: measures(lines, name) for name, lines in sets.items()})
