"""A task's splits as token-id arrays, for a machine without seqio or TensorFlow.

``split_arrays`` (with seqio) reads a split as the evaluation reads it (EOS included,
truncated to the task's lengths), ``compact`` stores it as uint16 token ids trimmed of empty
columns; ``load_arrays`` reads an export (``tools/gpu_sequence_run.py export``) back, and
``features``, ``in_batches`` and ``batch_indices`` make the model's batches of it without
seqio.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

SPLITS = ("train", "validation", "test")
FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
            "decoder_loss_weights")


def compact(ids: np.ndarray) -> np.ndarray:
  """``ids`` as uint16 without the trailing all-zero columns (at least one column kept)."""
  if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.uint16).max):
    raise ValueError(f"token ids from {ids.min()} to {ids.max()} do not fit uint16")
  used = np.flatnonzero(ids.any(0))
  return ids[:, :max(1, used[-1] + 1 if used.size else 1)].astype(np.uint16)


def padded(ids: np.ndarray, length: int) -> np.ndarray:
  """uint16 ``ids`` back as int32 of ``length`` columns (zeros after)."""
  return np.pad(ids.astype(np.int32), [(0, 0), (0, length - ids.shape[1])])


def features(inputs: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
  """The encoder-decoder batch of int32 ``inputs`` and ``targets`` (seqio's
  ``EncDecFeatureConverter`` without packing: targets shifted right, weights on tokens)."""
  return {"encoder_input_tokens": inputs, "decoder_target_tokens": targets,
          "decoder_input_tokens": np.pad(targets[..., :-1], [(0, 0)] * (targets.ndim - 1)
                                         + [(1, 0)]),
          "decoder_loss_weights": (targets > 0).astype(np.int32)}


def split_features(arrays: dict[str, np.ndarray], split: str, lengths: dict[str, int]
                   ) -> dict[str, np.ndarray]:
  """``features`` of a split's pairs at the task's ``lengths``."""
  return features(padded(arrays[f"{split}_inputs"], lengths["inputs"]),
                  padded(arrays[f"{split}_targets"], lengths["targets"]))


def in_batches(arrays: dict[str, np.ndarray], batch_size: int) -> list[dict[str, np.ndarray]]:
  """Feature batches of ``batch_size`` rows, the last padded with empty rows (as
  ``TaskData.eval_batches``)."""
  from meshbayes.data.text_lines import in_batches as rows_in_batches

  names = list(arrays)
  return [dict(zip(names, parts)) for parts in zip(
      *(rows_in_batches(arrays[name], batch_size) for name in names))]


def batch_indices(num_rows: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
  """Rows of each training batch: a fresh permutation each epoch, the remainder dropped."""
  if num_rows < batch_size:
    raise ValueError(f"run: {num_rows} training pairs are fewer than a batch of {batch_size}")
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(num_rows)
    for start in range(0, num_rows - batch_size + 1, batch_size):
      yield order[start:start + batch_size]


def split_arrays(task: str, lengths: dict[str, int], split: str, batch_size: int = 1024
                 ) -> tuple[np.ndarray, np.ndarray]:
  """``(pairs, L_in)`` inputs and ``(pairs, L_out)`` targets of a split as the evaluation
  reads it (``TaskData.eval_batches``: in order, EOS included, truncated), padding rows
  dropped."""
  from meshbayes.data.pipeline import TaskData
  from meshbayes.partitioning import DataLayout

  data = TaskData(task, lengths, batch_size, shuffle=False)
  batches = list(data.eval_batches(DataLayout(batch_size), split))
  inputs = np.concatenate([b["encoder_input_tokens"] for b in batches])
  targets = np.concatenate([b["decoder_target_tokens"] for b in batches])
  present = inputs.any(-1)
  return inputs[present], targets[present]


def load_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """The arrays and meta ``export`` wrote to ``path``."""
  if not path.is_file():
    raise ValueError(f"--arrays={path}: no such file (write it with the export subcommand)")
  with np.load(path) as stored:
    if "meta" not in stored.files:
      raise ValueError(f"--arrays={path}: not an export of this tool (no meta)")
    return {k: stored[k] for k in stored.files if k != "meta"}, json.loads(str(stored["meta"]))
