"""Decoding that resumes: each predictive's decoded batches saved as they complete.

``DecodeLog`` keeps one file per predictive under ``OUT/partial/``: a fingerprint line
(run, step, predictive, decoding settings, sources), then one line per completed batch.
An evaluation started again with the same fingerprint takes those batches
(``decode_passes.Resumable``'s ``done``) and gives the uninterrupted result; another fingerprint
starts afresh. ``OUT/partial/`` is removed once the results are written. The lines are
strict JSON; a non-finite number is saved as null with its reason and read back as the
number (``strict_json.restore``), so a resumed result equals the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from etils import epath

from meshbayes.evaluation.decoding import Decoded
from meshbayes.runtime import strict_json

PARTIAL_DIR = "partial"


def _as_record(row: Mapping[str, Any]) -> Decoded:
  return Decoded(
      tuple(row["output_ids"]), row["log_prob"], row["num_tokens"], row["entropy"],
      row["mutual_information"], dict(row["measures"]), tuple(row["token_log_probs"]),
      tuple(tuple(sample) for sample in row["samples"]), tuple(row["sample_log_probs"]))


class DecodeLog:
  """The saved batches of one predictive's decoding (``OUT/partial/decoded_<name>.jsonl``).

  Attributes:
    path: the file.
    done: the batches saved by an earlier attempt with the same fingerprint, in order.
  """

  def __init__(self, out_dir: epath.PathLike, name: str, fingerprint: Mapping[str, Any]):
    self.path = epath.Path(out_dir) / PARTIAL_DIR / f"decoded_{name}.jsonl"
    self._header = strict_json.dumps(dict(fingerprint), sort_keys=True, default=str)
    self.done: list[list[Decoded]] = []
    if self.path.exists():
      lines = self.path.read_text().splitlines()
      if lines and lines[0] == self._header:
        for index, line in enumerate(lines[1:]):
          try:
            row = strict_json.restore(json.loads(line))
          except json.JSONDecodeError:  # the last line, cut short by the interruption
            break
          if row["batch"] != index:
            break
          self.done.append([_as_record(record) for record in row["records"]])
    self.path.parent.mkdir(parents=True, exist_ok=True)
    # Rewritten whole: the header and the batches kept, without a cut-short line.
    self.path.write_text("".join(f"{line}\n" for line in [self._header, *(
        self._line(i, batch) for i, batch in enumerate(self.done))]))

  @staticmethod
  def _line(index: int, records: list[Decoded]) -> str:
    return strict_json.dumps({"batch": index, "records": [dataclasses.asdict(r) for r in records]},
                             null_reasons=strict_json.NULL_REASONS)

  def save(self, index: int, records: list[Decoded]) -> None:
    """Appends batch ``index``'s records (``decode_passes.Resumable``'s ``on_batch``)."""
    with self.path.open("a") as log:
      log.write(self._line(index, records) + "\n")
      log.flush()


def remove(out_dir: epath.PathLike) -> None:
  """Removes the saved batches once the evaluation's results are written."""
  partial = epath.Path(out_dir) / PARTIAL_DIR
  if partial.exists():
    partial.rmtree()
