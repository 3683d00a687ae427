"""Checkpoints through orbax: periodic asynchronous saves, exact restores onto any mesh.

``Checkpoints`` saves ``MODEL_DIR/checkpoints/<step>/`` (items ``state``, ``meta``,
``input``) atomically and restores it onto the shardings of an abstract target,
whatever mesh saved it. Every array's checksum is verified on restore: a failed
save is a one-line ``CheckpointError``, corrupt data a ``CorruptCheckpointError``
naming the step and the array. Layout and guarantees: docs/training.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from meshbayes.partitioning.specs import path_names
from meshbayes.runtime.console import say
from meshbayes.runtime.gin_preflight import TRAIN_FIRST
from meshbayes.training import checkpoint_integrity

STATE, META, INPUT = "state", "meta", "input"
_STATE_NAME = re.compile(r"^[\w.-]+$")
_ORBAX_COMMIT_MARKER = "commit_success.txt"  # orbax's, in every item directory
# Files every complete step directory holds (orbax 0.12 with OCDBT), besides each
# ``state/ocdbt.process_<i>/`` database's manifest and data files.
_REQUIRED_FILES = ("_CHECKPOINT_METADATA", f"{STATE}/_METADATA", f"{STATE}/manifest.ocdbt",
                   f"{META}/metadata")
CORRUPT_SUFFIX = ".corrupt"
# The training option that restores the newest intact checkpoint (run_configs.CheckpointConfig).
FALLBACK_BINDING = "run_configs.CheckpointConfig.fallback_on_corrupt"


class CheckpointError(ValueError):
  """A checkpoint is missing, corrupt, incomplete, of another model, or could not be written."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint's data is unreadable, incomplete or does not match its checksums.

  Attributes:
    arrays: the paths of the arrays that do not match their checksums (empty when the
      checkpoint could not be read).
  """

  def __init__(self, message: str, arrays: Sequence[str] = ()):
    super().__init__(message)
    self.arrays = tuple(arrays)


def _first_line(error: BaseException) -> str:
  text = str(error).strip() or type(error).__name__
  line = text.splitlines()[0]
  return line if len(line) <= 300 else line[:297] + "..."


def as_path(path: str | os.PathLike) -> epath.Path:
  """``path`` as an absolute ``epath.Path`` (orbax wants absolute paths); a URI such as
  ``gs://bucket/run`` is kept as it is."""
  path = epath.Path(path)
  return path if "://" in os.fspath(path) else path.absolute()


def _shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {"/".join(path_names(p)): (tuple(x.shape), str(np.dtype(x.dtype))) for p, x in leaves}


def check_compatible(saved: Any, target: Any, where: str) -> None:
  """Raises a ``CheckpointError`` naming the arrays where ``saved`` and ``target`` differ,
  the parameters first (the optimizer state follows them)."""
  saved, target = _shapes(saved), _shapes(target)
  problems = [(name, "is missing") for name in target.keys() - saved.keys()]
  problems += [(name, "is unexpected") for name in saved.keys() - target.keys()]
  problems += [(name, f"has shape {saved[name][0]} {saved[name][1]}, the model needs "
                      f"{target[name][0]} {target[name][1]}")
               for name in saved.keys() & target.keys() if saved[name] != target[name]]
  if problems:
    problems.sort(key=lambda problem: (not problem[0].startswith("params/"), problem[0]))
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    raise CheckpointError(f"checkpoint {where} does not fit this model: "
                          f"{'; '.join(' '.join(p) for p in problems[:3])}{more}; use the "
                          "run's own model settings (its config.gin) or a new MODEL_DIR")


def find_step_dir(path: str | os.PathLike, step: int | None = None) -> epath.Path:
  """The directory of one checkpoint, from a model dir, its ``checkpoints`` dir or a step dir.

  Raises:
    CheckpointError: no checkpoint there (or not that step).
  """
  path = as_path(path)
  if (path / STATE).is_dir():
    return path
  root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
  steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
  if not steps:
    raise CheckpointError(f"no checkpoint in {path}: expected a model directory, its "
                          f"checkpoints/ directory or a checkpoint step directory; {TRAIN_FIRST}")
  if step is None:
    return root / str(steps[-1])
  if step not in steps:
    raise CheckpointError(f"no checkpoint of step {step} in {root}; steps: {steps}")
  return root / str(step)


def missing_parts(step_dir: str | os.PathLike) -> list[str]:
  """The structural files a step directory lacks (none: it is complete), without reading
  arrays; an array data file deleted alone is found by reading (``read_arrays``)."""
  step_dir = as_path(step_dir)
  missing = [name for name in _REQUIRED_FILES if not (step_dir / name).exists()]
  databases = sorted((step_dir / STATE).glob("ocdbt.process_*"))
  if (step_dir / STATE).is_dir() and not databases:
    missing.append(f"{STATE}/ocdbt.process_*")
  for database in [step_dir / STATE, *databases]:
    if not (database / "d").is_dir() or not any((database / "d").iterdir()):
      missing.append(f"{database.relative_to(step_dir)}/d/*")
    if not (database / "manifest.ocdbt").exists():
      missing.append(f"{database.relative_to(step_dir)}/manifest.ocdbt")
  return list(dict.fromkeys(missing))


def step_dirs(root: str | os.PathLike) -> list[epath.Path]:
  """The step directories under a ``checkpoints`` directory, oldest first (complete or not)."""
  root = as_path(root)
  names = [p.name for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []
  return [root / name for name in sorted(names, key=int)]


def verify(step_dir: str | os.PathLike, expected: Mapping[str, str] | None, tree: Any,
           hint: str = "") -> bool:
  """Checks ``tree``'s arrays against a checkpoint's checksums, ``expected``: False when it
  has none (saved before them), True when all match.

  Raises:
    CorruptCheckpointError: naming the first array that does not match.
  """
  if expected is None:
    return False
  bad = checkpoint_integrity.mismatches(expected, tree)
  if bad:
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise CorruptCheckpointError(f"checkpoint {step_dir} is corrupt: array {bad[0]}{more} "
                                 f"does not match its checksum{hint}", bad)
  return True


def _note_unverified(step_dir: epath.Path) -> None:
  say(f"note: checkpoint {step_dir} has no checksums (saved before they were written); "
      "its arrays are not verified")


def saved_tree(step_dir: str | os.PathLike) -> Any:
  """The saved state's tree of array metadata (shapes, dtypes), without reading arrays."""
  step_dir = as_path(step_dir)
  try:
    _check_manifest(step_dir / STATE)
    with contextlib.closing(ocp.StandardCheckpointHandler()) as handler:
      return handler.metadata(step_dir / STATE).tree
  except Exception as error:  # orbax raises many types for unreadable metadata
    raise CorruptCheckpointError(f"checkpoint {step_dir} is corrupt or incomplete: "
                                 f"{_first_line(error)}") from error


def read_meta(step_dir: str | os.PathLike) -> dict[str, Any]:
  """The checkpoint's JSON metadata."""
  step_dir = as_path(step_dir)
  try:
    with contextlib.closing(ocp.JsonCheckpointHandler()) as handler:
      return dict(handler.restore(step_dir / META))
  except Exception as error:
    raise CorruptCheckpointError(f"checkpoint {step_dir} has no readable {META} item ("
                                 f"{_first_line(error)}): it is incomplete or was not written "
                                 "by meshbayes") from error


def input_state_names(step_dir: str | os.PathLike) -> list[str]:
  """The names of the input positions a checkpoint holds (none before they were saved)."""
  directory = as_path(step_dir) / INPUT
  names = [p.name for p in directory.iterdir()] if directory.is_dir() else []
  return sorted(name for name in names if name != _ORBAX_COMMIT_MARKER)


def read_input_states(step_dir: str | os.PathLike, names: Sequence[str] | None = None
                      ) -> dict[str, bytes]:
  """The saved input positions of a checkpoint by name (``names`` that it holds, else all)."""
  directory = as_path(step_dir) / INPUT
  try:
    names = input_state_names(step_dir) if names is None else names
    return {name: (directory / name).read_bytes() for name in names
            if (directory / name).exists()}
  except OSError as error:
    raise CheckpointError(f"checkpoint {step_dir} has an unreadable {INPUT} item: "
                          f"{_first_line(error)}") from error


def _check_manifest(state_dir: epath.Path) -> None:
  """Lists an OCDBT state's keys, which reads its manifest: a damaged one fails here, in
  one operation, rather than in each of orbax's parallel reads (whose callbacks then fire
  on its closed event loop and print tracebacks)."""
  if not (state_dir / "manifest.ocdbt").exists():
    return
  import tensorstore as ts  # pylint: disable=import-outside-toplevel  (orbax's own)

  base = os.fspath(state_dir) if "://" in os.fspath(state_dir) else f"file://{state_dir}"
  ts.KvStore.open({"driver": "ocdbt", "base": base.rstrip("/") + "/"}).result().list().result()


def read_arrays(step_dir: str | os.PathLike) -> dict[str, np.ndarray]:
  """Every array of a checkpoint's state, by path, read to this host and verified (for
  inspection).

  Raises:
    CorruptCheckpointError: unreadable, incomplete or not matching its checksums.
  """
  step_dir = as_path(step_dir)
  expected = read_meta(step_dir).get(checkpoint_integrity.CHECKSUMS_KEY)  # None: not verified
  # An explicit sharding: without one orbax reuses the saved sharding, which names the
  # devices of the processes that wrote the checkpoint (a multi-host one would not load).
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        saved_tree(step_dir), is_leaf=lambda x: hasattr(x, "shape"))
  try:
    with contextlib.closing(ocp.StandardCheckpointHandler()) as handler:
      state = handler.restore(step_dir / STATE, args=ocp.args.StandardRestore(target))
  except Exception as error:
    raise CorruptCheckpointError(f"checkpoint {step_dir} could not be read: "
                                 f"{_first_line(error)}") from error
  verify(step_dir, expected, state)
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return {"/".join(path_names(p)): np.asarray(x) for p, x in leaves}


def _matching(saved: Any, target: Any) -> Any:
  """The part of ``saved`` under the (nested) keys of ``target``."""
  if isinstance(target, Mapping) and isinstance(saved, Mapping):
    return {k: _matching(saved[k], v) for k, v in target.items() if k in saved}
  return saved


def restore_subtree(step_dir: str | os.PathLike, target: Any) -> Any:
  """Restores only the arrays in ``target`` (e.g. ``{'params': ...}``), with its shardings."""
  step_dir = as_path(step_dir)
  check_compatible(_matching(saved_tree(step_dir), target), target, str(step_dir))
  expected = read_meta(step_dir).get(checkpoint_integrity.CHECKSUMS_KEY)
  restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding), target)
  try:
    with ocp.PyTreeCheckpointer() as checkpointer:
      restored = checkpointer.restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
          item=target, restore_args=restore_args, partial_restore=True))
  except Exception as error:
    raise CorruptCheckpointError(f"checkpoint {step_dir} could not be read: "
                                 f"{_first_line(error)}") from error
  if not verify(step_dir, expected, restored):
    _note_unverified(step_dir)
  return restored


class InputStateHandler(ocp.AsyncCheckpointHandler):
  """The ``input`` item: the input pipeline's position, one file per input shard.

  Every process writes the files it is given (each shard's position once, by
  one of the hosts that read it), in the background like the arrays: the
  positions were captured when the save started, and serializing them may
  take a while (a whole-split shuffle buffer).
  """

  async def async_save(self, directory: epath.Path, args: InputStateSave
                       ) -> list[ocp.future.Future]:
    async def write():
      for name, serialize in args.states.items():
        (directory / name).write_bytes(serialize())

    return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="input_state_save")]

  def save(self, directory: epath.Path, args: InputStateSave) -> None:
    for future in asyncio.run(self.async_save(directory, args)):
      future.result()

  def restore(self, directory: epath.Path, args: InputStateRestore | None = None
              ) -> dict[str, bytes]:
    """Every saved position (the trainer reads its own with ``read_input_states``)."""
    del args
    return read_input_states(directory.parent)


@ocp.args.register_with_handler(InputStateHandler, for_save=True)
@dataclasses.dataclass
class InputStateSave(ocp.args.CheckpointArgs):
  """Positions to save: name (a file name) -> a function that serializes one."""

  states: Mapping[str, Callable[[], bytes]]

  def __post_init__(self):
    bad = [name for name in self.states if not _STATE_NAME.match(name)]
    if bad:
      raise ValueError(f"input state names {bad} must be file names ([A-Za-z0-9_.-])")


# Orbax knows a handler by its save and its restore arguments.
@ocp.args.register_with_handler(InputStateHandler, for_restore=True)
@dataclasses.dataclass
class InputStateRestore(ocp.args.CheckpointArgs):
  """Reads every saved position."""


class _QuietBackgroundSaveErrors(logging.Filter):
  """A failed background save is logged by each of orbax's threads with its traceback
  (hundreds of lines); ``Checkpoints`` reports it as one line instead."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR and record.exc_info
                and f"{os.sep}orbax{os.sep}" in record.pathname)


def _drop_abandoned_write_reports() -> None:
  """After a failed save, tensorstore completes the writes orbax stopped waiting for and
  reports each result it can no longer deliver ('Event loop is closed') through
  ``sys.excepthook``, dozens of tracebacks; the failure itself is reported as one line."""
  previous = sys.excepthook
  if getattr(previous, "drops_abandoned_writes", False):
    return

  def hook(kind, value, traceback):
    if not (kind is RuntimeError and str(value) == "Event loop is closed"):
      previous(kind, value, traceback)

  hook.drops_abandoned_writes = True
  sys.excepthook = hook


def _cause(error: BaseException) -> str:
  """A failed write's cause, short: 'no space left on device', else its first line."""
  chain, seen = error, set()
  while chain is not None and id(chain) not in seen:
    seen.add(id(chain))
    text = str(chain)
    if (isinstance(chain, OSError) and chain.errno == errno.ENOSPC) or (
        "No space left on device" in text or "os_error_code='28'" in text):
      return "no space left on device"
    chain = chain.__cause__ or chain.__context__
  return _first_line(error)


@dataclasses.dataclass
class Checkpoints:
  """The checkpoints of one run.

  Attributes:
    directory: where they live (``MODEL_DIR/checkpoints``; a local path or a
      URI such as ``gs://bucket/run/checkpoints``).
    max_to_keep: keep the newest N, a positive int (None: all).
    async_save: write in the background while training goes on.
  """

  directory: epath.Path
  max_to_keep: int | None = 3
  async_save: bool = True

  def __post_init__(self):
    if self.max_to_keep is not None and (not isinstance(self.max_to_keep, int) or isinstance(
        self.max_to_keep, bool) or self.max_to_keep < 1):
      raise ValueError(f"checkpoints to keep ({self.max_to_keep!r}) must be a positive int, "
                       "or None to keep all")
    self.directory = as_path(self.directory)
    self._remove_incomplete()
    self._quiet = _QuietBackgroundSaveErrors()
    logging.getLogger("absl").addFilter(self._quiet)
    _drop_abandoned_write_reports()
    self._pending: int | None = None  # the step being written in the background
    self._failed = False
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=self.max_to_keep,
                                             enable_async_checkpointing=self.async_save,
                                             cleanup_tmp_directories=True, create=True),
        item_handlers={STATE: ocp.StandardCheckpointHandler(),
                       META: ocp.JsonCheckpointHandler(), INPUT: InputStateHandler()})

  def _remove_incomplete(self) -> None:
    """Removes incomplete step directories older than the newest complete one (left by a
    kill while orbax deleted them); process 0 removes, every process waits for it."""
    if jax.process_index() == 0:
      incomplete = {int(d.name): bool(missing_parts(d)) for d in step_dirs(self.directory)}
      newest_complete = max((s for s, bad in incomplete.items() if not bad), default=-1)
      for step in (s for s, bad in incomplete.items() if bad and s < newest_complete):
        self.step_dir(step).rmtree()
        say(f"removed the incomplete checkpoint {self.step_dir(step)} (an interrupted "
            "deletion)")
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("meshbayes_checkpoints_remove_incomplete")

  def steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def save(self, step: int, state: Any, meta: dict[str, Any],
           input_states: Mapping[str, Callable[[], bytes]] | None = None) -> None:
    """Starts saving (asynchronously); a save of the same step is skipped.

    Args:
      step: the step.
      state: the train state.
      meta: JSON metadata.
      input_states: this process's share of the input position, by file name:
        functions that serialize positions captured before this call.

    Raises:
      CheckpointError: this save, or the previous one, could not be written.
    """
    self.wait()
    if step in self.steps():
      return
    checksums = checkpoint_integrity.checksums(state)
    meta = dict(meta, **{checkpoint_integrity.CHECKSUMS_KEY: checksums})
    try:
      self._manager.save(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardSave(state), META: ocp.args.JsonSave(meta),
          INPUT: InputStateSave(dict(input_states or {}))}), force=True)
    except Exception as error:  # orbax and tensorstore raise many types
      self._raise_failed(step, error)
    self._pending = step

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """The state of ``step`` placed as ``abstract_state``'s shardings say, and its meta,
    verified against the checkpoint's checksums.

    Raises:
      CorruptCheckpointError: the checkpoint is corrupt or incomplete.
      CheckpointError: it is of another model.
    """
    return self._restore(step, abstract_state, self.past_corrupt(step))

  def past_corrupt(self, step: int) -> str:
    """Training's way past a corrupt checkpoint of ``step``, as the end of its error line:
    the option that sets it aside (``restore_latest``'s fallback), or a new start."""
    earlier = [s for s in self.steps() if s < step]
    if earlier:
      return (f"; to resume from the checkpoint before it (step {earlier[-1]}), run again with "
              f"--gin.{FALLBACK_BINDING}=True, which sets the corrupt one aside")
    return ("; no checkpoint precedes it: move it aside (or use a new MODEL_DIR) to train "
            "from the start")

  def _restore(self, step: int, abstract_state: Any, hint: str) -> tuple[Any, dict[str, Any]]:
    step_dir = self.step_dir(step)
    try:
      saved = saved_tree(step_dir)
    except CheckpointError as error:
      raise CorruptCheckpointError(f"{error}{hint}") from error
    check_compatible(saved, abstract_state, str(step_dir))
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(abstract_state), META: ocp.args.JsonRestore()}))
    except Exception as error:
      raise CorruptCheckpointError(f"checkpoint {step_dir} is corrupt or incomplete: "
                                   f"{_first_line(error)}{hint}") from error
    meta = dict(restored[META])
    if not verify(step_dir, meta.pop(checkpoint_integrity.CHECKSUMS_KEY, None), restored[STATE],
                  hint):
      _note_unverified(step_dir)
    return restored[STATE], meta

  def restore_latest(self, abstract_state: Any, fallback: bool = False
                     ) -> tuple[int, Any, dict[str, Any]] | None:
    """The newest checkpoint's step, state and meta (see ``restore``); None when there is none.

    Args:
      abstract_state: the target, as for ``restore``.
      fallback: when the newest checkpoint is corrupt or incomplete, set it aside
        (renamed ``<step>.corrupt``, with a note) and restore the one before it,
        and so on; else raise.

    Raises:
      CorruptCheckpointError: the newest checkpoint is corrupt (without ``fallback``), or
        every checkpoint is (with it).
      CheckpointError: the checkpoint is of another model.
    """
    set_aside = []
    for step in reversed(self.steps()):
      if not fallback:
        return (step, *self.restore(step, abstract_state))
      try:
        return (step, *self._restore(step, abstract_state, hint=""))
      except CorruptCheckpointError as error:
        set_aside.append(self._set_aside(step))
        say(f"{_first_line(error)}; set aside as {set_aside[-1]}, falling back to the "
            "checkpoint before it")
    if set_aside:
      raise CorruptCheckpointError(f"every checkpoint in {self.directory} is corrupt or "
                                   f"incomplete (set aside as {', '.join(set_aside)})")
    return None

  def _set_aside(self, step: int) -> str:
    """Renames a corrupt checkpoint so that orbax no longer sees it (its data kept)."""
    name = f"{step}{CORRUPT_SUFFIX}"
    if jax.process_index() == 0:
      target = self.directory / name
      if target.exists():
        target.rmtree()
      self.step_dir(step).rename(target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"meshbayes_checkpoints_set_aside_{step}")
    self._manager.reload()
    return name

  def wait(self) -> None:
    """Blocks until every started save is on disk.

    Raises:
      CheckpointError: the save in the background failed (raised once).
    """
    if self._failed:
      return
    try:
      self._manager.wait_until_finished()
    except Exception as error:
      self._raise_failed(self._pending, error)
    self._pending = None

  def _raise_failed(self, step: int | None, error: BaseException) -> None:
    self._failed = True
    good = sorted(int(p.name) for p in self.directory.iterdir()
                  if p.name.isdigit() and int(p.name) != step) if self.directory.is_dir() else []
    last = (f"the last good checkpoint is step {good[-1]} in {self.directory}" if good
            else f"no checkpoint was written to {self.directory} yet")
    cause = _cause(error)
    advice = "free space and run again" if cause == "no space left on device" else "run again"
    raise CheckpointError(f"checkpoint of step {step} could not be written ({cause}); {last}; "
                          f"{advice}") from error

  def close(self) -> None:
    """Waits for the save in progress (see ``wait``) and releases orbax's resources."""
    try:
      self.wait()
    finally:
      try:
        self._manager.close()
      except Exception:
        if not self._failed:  # else orbax raises the failure already reported again
          raise
      finally:
        logging.getLogger("absl").removeFilter(self._quiet)
