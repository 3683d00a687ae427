"""A split's pairs grouped by source: the unit every decoded figure is counted in.

Each distinct source is decoded once and scored against all of its references;
teacher-forced token figures use every pair, summed per source (``Sources.sum_rows``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from meshbayes.evaluation.decoding import until_eos


def _text(ids: Iterable[int], vocabulary: Any) -> str:
  return vocabulary.decode(until_eos(ids, vocabulary.eos_id))


@dataclasses.dataclass(frozen=True)
class Sources:
  """A split's pairs grouped by source.

  Attributes:
    inputs: ``(n, input length)`` token ids of each distinct source, in order of first
      appearance.
    texts: each source's text.
    references: each source's distinct references (texts), in order of appearance.
    row_source: ``(rows,)`` the source of each row of the split's batches (-1: padding).
    reference_ids: each reference's token ids before EOS, as the batches hold them.
  """

  inputs: np.ndarray
  texts: list[str]
  references: list[list[str]]
  row_source: np.ndarray
  reference_ids: list[list[tuple[int, ...]]] = dataclasses.field(default_factory=list)

  def sum_rows(self, per_row: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-row arrays summed over each source's rows: ``(n, ...)`` each."""
    present = self.row_source >= 0
    summed = {}
    for name, values in per_row.items():
      total = np.zeros((len(self.texts),) + values.shape[1:], np.float64)
      np.add.at(total, self.row_source[present], values[present])
      summed[name] = total
    return summed


def group_sources(batches: Sequence[Mapping[str, np.ndarray]], input_vocabulary: Any,
                  vocabulary: Any) -> Sources:
  """The distinct sources of ``batches`` (by their input tokens) and their references."""
  inputs = np.concatenate([b["encoder_input_tokens"] for b in batches])
  targets = np.concatenate([b["decoder_target_tokens"] for b in batches])
  present = np.flatnonzero(inputs.any(-1))
  unique, first, inverse = np.unique(inputs[present], axis=0, return_index=True,
                                     return_inverse=True)
  order = np.argsort(first)
  rank = np.empty_like(order)
  rank[order] = np.arange(order.size)
  row_source = np.full(len(inputs), -1)
  row_source[present] = rank[inverse.ravel()]
  references: list[list[str]] = [[] for _ in order]
  reference_ids: list[list[tuple[int, ...]]] = [[] for _ in order]
  for row in present:
    reference = _text(targets[row], vocabulary)
    if reference not in references[row_source[row]]:
      references[row_source[row]].append(reference)
      reference_ids[row_source[row]].append(
          tuple(until_eos(targets[row], vocabulary.eos_id)))
  return Sources(unique[order], [_text(ids, input_vocabulary) for ids in unique[order]],
                 references, row_source, reference_ids)
