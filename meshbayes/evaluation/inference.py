"""Inference from a checkpoint (``python -m meshbayes.infer``): a file of inputs, one per
line, decoded into a file of outputs, with each output's probability and uncertainty.

One output line per input line, always (a blank input gives an empty line and a scores
record marked ``"empty": true``); too-long inputs are truncated with one warning line.
Files may be local or ``gs://``. The text and the scores are one unit: a manifest
written last names both files' checksums and the run (``write_outputs``), and
``read_outputs`` refuses, in one line, a text and scores that do not belong together.
One infer at a time writes an output: it holds ``OUTPUT_FILE.lock`` while it runs.

``OUTPUT_FILE.scores.jsonl`` holds one JSON record per input line: ``line`` (1-based),
``empty`` (a blank input: nothing decoded, the scores null), ``output``, ``log_prob`` (of
the output and its EOS under the predictive distribution, nats), ``num_tokens`` (scored:
output tokens + EOS, at most the target length), ``entropy`` and ``mutual_information``
(per-token means, nats; the latter null unless a model average), ``input_tokens_cut``.

The two are one unit (``write_outputs``): ``OUTPUT_FILE`` stays a plain text file, and
``OUTPUT_FILE.manifest.json``, written last, names both files' checksums and the run
(model directory, checkpoint step, predictive, its method when given, decode settings,
input file and its checksum); ``read_outputs`` refuses a text and scores it does not
name. For the whole run process 0 holds ``OUTPUT_FILE.lock``: a second infer to the same
output stops at once with one line naming the holder; a lock left by a process that is
gone is taken over. Local files are renamed into place; ``gs://`` objects are written
directly (whole), the manifest still last, and locked as ``RunLock`` locks an object store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import tqdm
from etils import epath

from meshbayes.data.pipeline import TaskData, get_task
from meshbayes.evaluation import methods, predictives
from meshbayes.evaluation.context import restored
from meshbayes.evaluation.decoding import DecodeContext, Decoded, decode_and_score
from meshbayes.evaluation.manifest import checksum
from meshbayes.evaluation.settings import PredictiveConfig
from meshbayes.field_checks import positive_int
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner
from meshbayes.runtime import strict_json
from meshbayes.runtime.atomic_files import same_file, write_files_atomically
from meshbayes.runtime.run_lock import LockHeldError, RunLock, acquire_on_process_0
from meshbayes.data.text_lines import (EncodedLines, encode_inputs, in_batches, read_lines,
                                  truncation_warning)

SCORES_SUFFIX = ".scores.jsonl"
MANIFEST_SUFFIX = ".manifest.json"
LOCK_SUFFIX = ".lock"
# The files of one output besides OUTPUT_FILE itself: their names add these to its name.
_SUFFIXES = {"scores": SCORES_SUFFIX, "manifest": MANIFEST_SUFFIX, "lock": LOCK_SUFFIX}
MANIFEST_FORMAT = 1
_NOTHING_MEASURED = {"log_prob": None, "num_tokens": 0, "entropy": None,
                     "mutual_information": None}


def output_lines(encoded: EncodedLines, records: Sequence[Decoded],
                 vocabulary: Any, with_mutual_information: bool
                 ) -> tuple[list[str], list[dict[str, Any]]]:
  """The text output and the scores record of every input line, in order.

  Args:
    encoded: the inputs.
    records: one per present input, in order (``evaluation.decoding.decode_and_score``).
    vocabulary: decodes the outputs.
    with_mutual_information: the records come from a model average (else the
      mutual information, 0 by construction, is written as null).

  Returns:
    ``(texts, scores)``, one of each per input line (see ``infer``).
  """
  if len(records) != int(encoded.present.sum()):
    raise ValueError(f"output_lines: {len(records)} records for {int(encoded.present.sum())} "
                     "non-empty inputs")
  records = iter(records)
  texts, scores = [], []
  for number, (present, cut) in enumerate(zip(encoded.present, encoded.tokens_cut), 1):
    if present:
      record = next(records)
      # A newline inside an output would shift every later line.
      text = vocabulary.decode(list(record.output_ids)).replace("\n", " ")
      measured = {"log_prob": record.log_prob, "num_tokens": record.num_tokens,
                  "entropy": record.entropy, "mutual_information":
                  record.mutual_information if with_mutual_information else None}
    else:
      text, measured = "", _NOTHING_MEASURED
    texts.append(text)
    scores.append({"line": number, "empty": not present, "output": text, **measured,
                   "input_tokens_cut": int(cut)})
  return texts, scores


@dataclasses.dataclass(frozen=True)
class Outputs:
  """One infer's outputs, checked to belong together (``read_outputs``).

  Attributes:
    texts: the output lines (without their newlines).
    scores: one record per line (see ``infer``).
    manifest: what wrote them (see ``write_outputs``).
  """

  texts: list[str]
  scores: list[dict[str, Any]]
  manifest: dict[str, Any]


def output_paths(output_file: str | os.PathLike) -> dict[str, epath.Path]:
  """The files of one output: ``text`` (``output_file``), ``scores``, ``manifest``, ``lock``."""
  output = epath.Path(output_file)
  return {"text": output, **{key: output.with_name(output.name + suffix)
                             for key, suffix in _SUFFIXES.items()}}


def write_outputs(output_file: str | os.PathLike, texts: Sequence[str],
                  scores: Sequence[Mapping[str, Any]], run: Mapping[str, Any]
                  ) -> dict[str, Any]:
  """Writes ``texts`` and ``scores`` as one unit; the caller holds the output's lock.

  The text (one line each) and the scores (one strict-JSON record a line) are written
  whole, then the manifest, last: ``OUTPUT_FILE.manifest.json`` naming each file with
  its SHA-256 checksum, and ``run``. Interrupted before the text and scores are renamed
  into place, the previous unit stays; after, the previous manifest no longer matches
  them, so nothing reads as complete until a run finishes.

  Returns:
    The manifest.
  """
  paths = output_paths(output_file)
  text = "".join(line + "\n" for line in texts).encode("utf-8")
  scored = "".join(strict_json.dumps(dict(s)) + "\n" for s in scores).encode("utf-8")
  write_files_atomically([(paths["text"], text), (paths["scores"], scored)])
  manifest = {"format": MANIFEST_FORMAT,
              "text": {"file": paths["text"].name, "checksum": checksum(text),
                       "lines": len(texts)},
              "scores": {"file": paths["scores"].name, "checksum": checksum(scored)},
              "run": dict(run), "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "host": socket.gethostname(), "pid": os.getpid()}
  write_files_atomically([(paths["manifest"],
                 (strict_json.dumps(manifest, indent=2, default=str) + "\n").encode())])
  return manifest


def read_outputs(output_file: str | os.PathLike) -> Outputs:
  """The text and scores of one infer at ``output_file``, checked against its manifest.

  Raises:
    ValueError: one line, when there is no manifest (being written, interrupted, or
      written before manifests) or a file is missing or not the one the manifest names
      (text and scores of different runs, or an interrupted write).
  """
  paths = output_paths(output_file)
  for _ in range(3):  # a writer that replaced the unit meanwhile: read the new one
    try:
      manifest_bytes = paths["manifest"].read_bytes()
    except FileNotFoundError:
      raise ValueError(f"{output_file}: no manifest {paths['manifest']}, so not the complete "
                       "outputs of one infer (being written, interrupted, or written before "
                       "manifests); run infer again") from None
    try:
      manifest = strict_json.loads_strict(manifest_bytes.decode("utf-8"))
      expected = {key: manifest[key]["checksum"] for key in ("text", "scores")}
    except (ValueError, KeyError, TypeError) as error:
      raise ValueError(f"{paths['manifest']}: not an infer manifest ({error!r}); run infer "
                       "again") from None
    data = {}
    for key in ("text", "scores"):
      try:
        data[key] = paths[key].read_bytes()
      except FileNotFoundError:
        data[key] = None
    with contextlib.suppress(FileNotFoundError):
      if paths["manifest"].read_bytes() == manifest_bytes:
        break
  for key in ("text", "scores"):
    if data[key] is None:
      raise ValueError(f"{output_file}: {paths[key]} is missing, though its manifest "
                       f"{paths['manifest']} names it; run infer again")
    if checksum(data[key]) != expected[key]:
      raise ValueError(f"{output_file}: {paths[key]} is not the file its manifest "
                       f"{paths['manifest']} names (checksum {checksum(data[key])}, manifest "
                       f"{expected[key]}): text and scores of different runs, or an interrupted "
                       "write; run infer again")
  texts = data["text"].decode("utf-8").split("\n")[:-1]
  scores = [strict_json.loads_strict(line) for line in data["scores"].decode().splitlines()]
  return Outputs(texts, scores, manifest)


def lock_output(output_file: str | os.PathLike) -> tuple[RunLock, str | None]:
  """Takes ``OUTPUT_FILE.lock`` (``RunLock``'s protocol on that file: a lock of a
  process that is gone, on this host, or silent past its lease, is taken over).

  Returns:
    ``(the held lock, a note when a stale lock was taken over, else None)``.

  Raises:
    RuntimeError: another live infer holds it (one line naming it and what to do).
  """
  path = output_paths(output_file)["lock"]
  lock = RunLock(path.parent, lock_name=path.name)
  try:
    return lock, lock.acquire()
  except LockHeldError as error:
    holder = error.holder
    raise RuntimeError(
        f"infer: OUTPUT_FILE {output_file} is being written by another infer (host "
        f"{holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}; "
        f"lock {path}); wait for it to finish or stop it, or give another OUTPUT_FILE "
        "(the lock of a process that is gone is taken over)") from None
  except OSError as error:
    raise RuntimeError(f"infer: cannot lock OUTPUT_FILE {output_file} ({path}): "
                       f"{error}") from None


def infer(*, model_dir: str, model: BaseModel, data: TaskData, input_file: str,
          output_file: str, partitioner: Partitioner | None = None,
          checkpoint_step: int | None = None, decode_method: str = "beam", beam_size: int = 4,
          num_samples: int = 0, seed: int = 0, method: str | None = None) -> int:
  """Decodes each line of ``input_file`` into the same line of ``output_file``.

  Inputs are encoded with the task's input vocabulary and truncated to its input length
  (a warning names them); decodes use ``data.batch_size`` rows at a time, as ``evaluate``
  decodes (``evaluation.decoding``), with a progress bar on stderr. The scores, manifest
  and lock: the module's docstring. Process 0 writes the files and prints.

  Args:
    model_dir: the run's directory (its checkpoints).
    model: the model.
    data: the task (its vocabularies and feature lengths) and the batch size.
    input_file: text, one input per line (local or ``gs://``).
    output_file: where the outputs go, one per line (local or ``gs://``).
    partitioner: mesh and rules (default: data parallel).
    checkpoint_step: which checkpoint (default: the latest).
    decode_method: ``beam``, ``greedy`` or ``sample``.
    beam_size: beams for ``beam``.
    num_samples: 0 decodes a Bayesian model with its posterior mean, ``S > 0`` with the
      model average of ``S`` weight samples (which gives the mutual information). Unlike ``evaluate``'s
      ``PredictiveConfig.num_samples`` (4), 0 by default: one decode per batch.
    seed: seed of weight samples and sampling.
    method: the predictive method, as ``PredictiveConfig.method`` (``evaluation.methods``:
      ``mc_dropout``, ``laplace``, ...; None: the run as trained); its headline
      predictive decodes.

  Returns:
    The number of lines written (as many as ``input_file`` has).

  Raises:
    RuntimeError: another infer is writing ``output_file``.
  """
  positive_int("infer", "num_samples", num_samples, allow_zero=True)
  settings = PredictiveConfig(method=method, num_samples=num_samples, seed=seed)
  paths = _checked_paths(input_file, output_file)
  encoded = _encoded(data, input_file)
  partitioner = partitioner or Partitioner()
  try:  # before any work: decoding places BATCH_SIZE rows over the mesh's batch axes
    partitioner.data_layout(data.batch_size)
  except ValueError as error:
    raise ValueError(f"infer: BATCH_SIZE={data.batch_size}: {error}") from None
  if method is not None:  # the method checked against the run before anything loads
    methods.resolve_run(method, model, model_dir, checkpoint_step)
  if jax.process_index() == 0:
    paths["text"].parent.mkdir(parents=True, exist_ok=True)
  # Before the restore: a second run stops now.
  lock = acquire_on_process_0(
      lambda: lock_output(output_file),
      lambda note: print(f"infer: {note} ({paths['lock']})", file=sys.stderr, flush=True),
      f"infer: process 0 could not lock OUTPUT_FILE {output_file}; see its error")
  try:
    return _decode_file(
        _Inference(model_dir, model, data, partitioner, checkpoint_step, settings),
        encoded, output_file, {"method": decode_method, "beam_size": beam_size})
  finally:
    if lock is not None:
      lock.release()


@dataclasses.dataclass(frozen=True)
class _Inference:
  """The run an infer decodes with, and its predictive settings."""

  model_dir: str
  model: BaseModel
  data: TaskData
  partitioner: Partitioner
  checkpoint_step: int | None
  settings: PredictiveConfig


def _checked_paths(input_file: str, output_file: str) -> dict[str, epath.Path]:
  """``output_paths(output_file)``, none of them ``input_file``."""
  paths = output_paths(output_file)
  for name, path in (("OUTPUT_FILE", str(output_file)), *(
      (f"OUTPUT_FILE + {suffix!r}", str(output_file) + suffix) for suffix in _SUFFIXES.values())):
    if same_file(path, input_file):
      raise ValueError(f"infer: {name} {path!r} is INPUT_FILE {str(input_file)!r} (it "
                       "would overwrite the inputs); give another OUTPUT_FILE")
  return paths


@dataclasses.dataclass(frozen=True)
class _Encoded:
  """The input file, encoded, and its checksum."""

  path: str
  lines: EncodedLines
  checksum: str


def _encoded(data: TaskData, input_file: str) -> _Encoded:
  encoded = encode_inputs(read_lines(input_file),
                          get_task(data.task).output_features["inputs"].vocabulary,
                          data.feature_lengths["inputs"], source=str(input_file))
  return _Encoded(str(input_file), encoded, checksum(epath.Path(input_file).read_bytes()))


def _decode_file(run: _Inference, given: _Encoded, output_file: str,
                 options: dict[str, Any]) -> int:
  """``infer``'s decoding and writing, under the output's lock."""
  data, writer, encoded, input_file = run.data, jax.process_index() == 0, given.lines, given.path
  warning = truncation_warning(encoded.tokens_cut, input_file, data.feature_lengths["inputs"])
  if warning and writer:
    print(warning, file=sys.stderr, flush=True)
  model, params, step = restored(run.model_dir, run.model, data, run.partitioner,
                                 run.checkpoint_step, run.settings)
  predictive = predictives.variants(model, params, run.settings.num_samples)[0]
  inputs = encoded.rows[encoded.present]  # empty lines take no room in the batches
  batches = tqdm.tqdm(in_batches(inputs, data.batch_size), desc="decoding",
                      unit=" batches", total=-(-len(inputs) // data.batch_size),
                      disable=not writer, file=sys.stderr)
  records = decode_and_score(DecodeContext(
      model, params, run.partitioner, predictive, jax.random.key(run.settings.seed),
      data.feature_lengths["targets"], data.vocabulary.eos_id, options), batches)
  texts, scores = output_lines(encoded, records, data.vocabulary,
                               with_mutual_information=predictive.num_samples > 0)
  if writer:
    method = {} if run.settings.method is None else {"method": run.settings.method}
    write_outputs(output_file, texts, scores, {
        "model_dir": str(run.model_dir), "checkpoint_step": step, "task": data.task,
        "feature_lengths": dict(data.feature_lengths), "batch_size": data.batch_size,
        "predictive": predictive.name, "num_samples": predictive.num_samples,
        "decode_method": options["method"], "beam_size": options["beam_size"],
        "seed": run.settings.seed, **method, "input_file": input_file,
        "input_checksum": given.checksum})
    paths = output_paths(output_file)
    print(f"decoded {len(texts)} lines of {input_file} ({len(texts) - len(inputs)} empty) "
          f"into {output_file}, scores in {paths['scores']}, manifest in "
          f"{paths['manifest']}")
  return len(texts)
