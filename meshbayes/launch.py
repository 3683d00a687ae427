"""Command lines configured with gin, as T5X's: ``--gin_file``, ``--gin.NAME=VALUE``.

``--gin_file=F`` (repeatable) is found as given, on ``--gin_search_paths=DIR,...``,
then among the installed presets ``gin_configs/`` (from any directory);
``--gin.NAME=VALUE`` bindings apply after the files, later ones winning. Values
are Python literals: a string needs quotes, ``--gin.MODEL_DIR="'runs/x'"``.
``meshbayes.eval`` and ``meshbayes.infer`` first apply the model's bindings of
``MODEL_DIR/config.gin`` (the training run's), which the command line overrides.
Every configurable and its settings, with defaults: ``docs/configuration.md``, written by
``python -m meshbayes.tools.config_reference``; every tool: ``python -m meshbayes.tools``.

Multi-host runs (docs/multihost.md): ``--coordinator_address=HOST:PORT
--num_processes=N --process_id=I``, or ``--multihost`` (JAX detects a TPU pod,
SLURM, Open MPI or Kubernetes); ``--num_cpu_devices=N`` (CPU devices per
process), ``--heartbeat_timeout_seconds=S`` (a process silent this long is dead).

An error is one line, ``PROG: error: MESSAGE (traceback in LOG)``, and status 1
(2 for a malformed command line); ``MESHBAYES_TRACEBACK=1`` shows the traceback.
LOG is in ``MODEL_DIR/logs/`` (else the temporary directory), where the newest 20
such logs are kept (older ``meshbayes.*-<date>-<time>-<pid>.log`` files are removed).
SIGTERM and SIGINT make a training run save its last completed step and exit
143 or 130 (at once while there is nothing new to save).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gin

from meshbayes.runtime import distributed, gin_preflight

USAGE = ("usage: python -m {prog} --gin_file=FILE [--gin_file=FILE ...] "
         "[--gin.NAME=VALUE ...] [--gin_search_paths=DIR,...] [--coordinator_address=HOST:PORT "
         "--num_processes=N --process_id=I | --multihost] [--num_cpu_devices=N] "
         "[--heartbeat_timeout_seconds=S]")
# Flag -> (field of DistributedOptions, parser of its value).
_DISTRIBUTED_FLAGS = {"--coordinator_address": ("coordinator_address", str),
                      "--num_processes": ("num_processes", int),
                      "--process_id": ("process_id", int),
                      "--num_cpu_devices": ("num_cpu_devices", int),
                      "--heartbeat_timeout_seconds": ("heartbeat_timeout_seconds", int)}
# Traceback logs kept per directory (MODEL_DIR/logs/, the temporary directory), the newest;
# only files named as _write_log names them are counted and removed.
KEPT_LOGS = 20
_LOG_NAME = re.compile(r"meshbayes\.[a-z_]+-(\d{8}-\d{6})-\d+\.log")
# Errors whose message is the whole story for a user; others are shown with their type.
_USER_ERRORS = (ValueError, OSError, RuntimeError, FloatingPointError)

gin.external_configurable(distributed.DistributedOptions, module="distributed")


class UsageError(ValueError):
  """The command line itself is malformed."""


# The command line.


def parse_flags(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]], list[str]]:
  """``(gin files, (flag, gin binding) pairs, search paths)`` from the command line."""
  files, bindings, paths = [], [], []
  args = list(argv)
  while args:
    arg = args.pop(0)
    name, has_value, value = arg.partition("=")
    if not has_value and name in ("--gin_file", "--gin_search_paths", "--gin_bindings") and args:
      value, has_value = args.pop(0), True
    if name == "--gin_file" and has_value:
      files.append(value)
    elif name == "--gin_search_paths" and has_value:
      paths.extend(p for p in value.split(",") if p)
    elif name == "--gin_bindings" and has_value:
      bindings.append((f"--gin_bindings={value}", value))
    elif name.startswith("--gin.") and has_value and len(name) > len("--gin."):
      bindings.append((arg, f"{name[len('--gin.'):]} = {value}"))
    else:
      raise UsageError(f"unknown or incomplete flag {arg!r}; expected --gin_file=FILE, "
                       "--gin.NAME=VALUE or --gin_search_paths=DIRS")
  if not files:
    raise UsageError("no --gin_file given; e.g. --gin_file=gin_configs/examples/"
                     "tiny_synthetic_bayesian.gin")
  return files, bindings, paths


def split_distributed_flags(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
  """The multi-host flags as ``DistributedOptions`` fields, and the other arguments."""
  rest, options = [], {}
  args = list(argv)
  while args:
    arg = args.pop(0)
    name, has_value, value = arg.partition("=")
    if name == "--multihost" and not has_value:
      options["auto"] = True
      continue
    if name not in _DISTRIBUTED_FLAGS:
      rest.append(arg)
      continue
    if not has_value:
      if not args:
        raise UsageError(f"flag {name} needs a value")
      value = args.pop(0)
    field, parse = _DISTRIBUTED_FLAGS[name]
    try:
      options[field] = parse(value)
    except ValueError:
      raise UsageError(f"flag {name}={value!r}: expected {parse.__name__}") from None
  return rest, options


def _is_first_process(distributed_flags: dict[str, Any]) -> bool:
  """Whether this is process 0, as far as the flags tell (``--multihost`` leaves it to
  JAX's cluster detection, which runs after the configuration is read)."""
  unknown = None if distributed_flags.get("auto") else 0
  return distributed_flags.get("process_id", unknown) == 0


# gin's own errors, told once the configurables are registered.


def _registered_names() -> list[str]:
  return [selector for selector, _ in gin.config._REGISTRY.items()  # no public listing
          if not selector.startswith("gin.")]


def _configurable_names(name: str) -> list[str]:
  """The registered configurables as a binding of ``name``'s depth would name them: the
  last as many dotted parts (``evaluate`` is registered as
  ``meshbayes.evaluation.driver.evaluate``, and a one-part name is compared with
  ``evaluate``, not with the whole selector)."""
  depth = len(name.split("."))
  return sorted({".".join(selector.split(".")[-depth:]) for selector in _registered_names()})


def _parameter_names(selector: str) -> list[str]:
  try:
    return list(inspect.signature(gin.config._REGISTRY.get_match(selector).wrapped).parameters)
  except (AttributeError, TypeError, ValueError):
    return []


def _same_path(a: Any, b: Any) -> bool:
  if not isinstance(a, str) or not isinstance(b, str) or "://" in a or "://" in b:
    return a == b
  return os.path.abspath(a) == os.path.abspath(b)


def _earlier_checkpoint(error: BaseException, entry_point: str, model_dir: Any) -> str:
  """For eval and infer, the binding that restores the checkpoint before a corrupt one of
  MODEL_DIR's run (``checkpoint_restore.CorruptRunCheckpointError`` names it), else ''."""
  step = getattr(error, "earlier_step", None)
  if (entry_point not in ("evaluate", "infer") or step is None
      or not _same_path(getattr(error, "model_dir", None), model_dir)):
    return ""
  return f"; --gin.{entry_point}.checkpoint_step={step} restores step {step}"


def _message(error: BaseException, entry_point: str = "", model_dir: Any = None) -> str:
  """The one line that tells ``error``: gin's errors in the command line's terms (and the
  nearest valid names), a user's error as its message, anything else with its type."""
  text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  # gin names a missing REQUIRED value by the parameter it was bound to; say which macro.
  required = re.search(r"Required bindings for `(\w+)` not provided in config: \[(.*)\]", text)
  if required:
    return (f"missing required gin values for {required.group(1)}: {required.group(2)}; set "
            "them, e.g. --gin.MODEL_DIR=\"'runs/x'\" (see the %gin.REQUIRED macros of the run's "
            "gin file)")
  macro = re.search(r"^(\w+)/macro\.value set to `%gin\.REQUIRED`", text)
  if macro:
    return (f"gin macro {macro.group(1)} is %gin.REQUIRED but not set; set it with "
            f"--gin.{macro.group(1)}=VALUE")
  unset = re.search(r"^No bindings specified for '(\w+)/gin\.macro'", text)
  if unset:
    return (f"gin macro {unset.group(1)} is used but not set; add the gin file that sets it or "
            f"--gin.{unset.group(1)}=VALUE")
  unknown = re.search(r"^No configurable matching '(.+)'", text)
  if unknown:
    return text.rstrip(".") + gin_preflight.suggestion(unknown.group(1),
                                                       _configurable_names(unknown.group(1)))
  parameter = re.search(r"^Configurable '(.+)' doesn't have a parameter named '(\w+)'", text)
  if parameter:
    return text.rstrip(".") + gin_preflight.suggestion(parameter.group(2),
                                                       _parameter_names(parameter.group(1)))
  if isinstance(error, _USER_ERRORS):
    return text + _earlier_checkpoint(error, entry_point, model_dir)
  return f"{type(error).__name__}: {text}"


# Reporting.


def _prune_logs(directory: Path, keep: int = KEPT_LOGS) -> None:
  """Removes all but the newest ``keep`` traceback logs in ``directory``: only files named
  as ``_write_log`` names them (``meshbayes.<command>-<date>-<time>-<pid>.log``); a log
  that cannot be removed is left."""
  logs = sorted((path for path in directory.iterdir() if _LOG_NAME.fullmatch(path.name)
                 and path.is_file()),
                key=lambda path: (_LOG_NAME.fullmatch(path.name).group(1), path.name))
  for path in logs[:-keep]:
    try:
      path.unlink()
    except OSError:  # another process's, removed first, or not ours to remove
      continue


def _write_log(prog: str, argv: Sequence[str], error: BaseException, model_dir: Any
               ) -> str | None:
  """Writes the traceback to ``MODEL_DIR/logs/`` (an existing local MODEL_DIR) or the
  temporary directory, keeping the newest ``KEPT_LOGS`` there; returns the file's path
  (None if neither can be written)."""
  name = f"{prog}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
  text = (f"{prog} {' '.join(argv)}\n\n"
          + "".join(traceback.format_exception(type(error), error, error.__traceback__)))
  directories = [Path(tempfile.gettempdir())]
  if isinstance(model_dir, str) and "://" not in model_dir and Path(model_dir).is_dir():
    directories.insert(0, Path(model_dir) / "logs")
  for directory in directories:
    try:
      directory.mkdir(exist_ok=True)
      (directory / name).write_text(text)
    except OSError:
      continue
    try:
      _prune_logs(directory)
    except OSError:  # the log is written; an unlistable directory keeps its old ones
      pass
    return str(directory / name)
  return None


def write_line(line: str) -> None:
  """Writes ``line`` and its newline to stderr in one ``write``.

  ``print`` in unbuffered mode writes the text and the newline apart, so a log line
  that C++ code (gloo, the coordination service) writes between them is glued onto
  it; one write of at most ``PIPE_BUF`` bytes reaches a pipe whole.
  """
  sys.stdout.flush()
  sys.stderr.write(line + "\n")
  sys.stderr.flush()


def _report(prog: str, argv: Sequence[str], error: Exception, model_dir: Any,
            entry_point: str = "") -> None:
  """One line on stderr, the traceback in a log file, and exit (status 2 for a usage
  error, else 1)."""
  label = distributed.process_label()
  line = f"{prog}: error: {label}{_message(error, entry_point, model_dir)}"
  if not isinstance(error, UsageError):
    log = _write_log(prog, argv, error, model_dir)
    line += f" (traceback in {log})" if log else ""
  write_line(line)
  status = 2 if isinstance(error, UsageError) else 1
  if label:
    # A normal exit waits at jax.distributed's shutdown barrier for peers that may be
    # blocked in a collective with this process; leaving at once makes them fail fast.
    sys.stdout.flush()
    os._exit(status)
  raise SystemExit(status) from None


def run(prog: str, entry_point: str, argv: Sequence[str] | None = None, *,
        model_from_model_dir: bool = False) -> Any:
  """Parses flags and gin files, then calls the gin configurable ``entry_point``.

  Args:
    prog: the command's name, for messages.
    entry_point: the gin configurable to call.
    argv: the arguments (default ``sys.argv[1:]``).
    model_from_model_dir: configure the model first as ``MODEL_DIR/config.gin``
      does, when there is one (eval, infer).

  Exits with status 2 on a usage error and 1 on any other error, after one line.
  """
  argv = sys.argv[1:] if argv is None else list(argv)
  if any(a in ("-h", "--help") for a in argv):
    print(USAGE.format(prog=prog))
    print(f"\nRuns the gin configurable {entry_point!r}, configured by the files and bindings.\n")
    print(__doc__.split("\n\n", 1)[1])
    return None
  model_dir = None
  try:
    rest, distributed_flags = split_distributed_flags(argv)
    files, flags, paths = parse_flags(rest)
    announce = _is_first_process(distributed_flags)
    if announce:
      print(f"{prog}: reading the configuration ...", flush=True)
    prefixes = gin_preflight.search_prefixes(paths)
    model_dir, trained_path, trained = gin_preflight.checked_configuration(
        files, flags, prefixes, entry_point, model_from_model_dir)
    if trained and announce:
      print(f"{prog}: the model is configured as in {trained_path}; --gin_file and --gin. "
            "bindings override it", flush=True)
    import meshbayes.configurables  # noqa: F401  (registers them; imports TensorFlow: seconds)

    gin.clear_config()
    for path in prefixes[1:]:
      gin.add_config_file_search_path(path)
    with gin_preflight.quiet_search_misses():
      gin.parse_config(trained)
      gin.parse_config_files_and_bindings(files, [binding for _, binding in flags])
    # Before the entry point: it is the first to use a device.
    options = gin.get_configurable("distributed.DistributedOptions")(**distributed_flags)
    distributed.initialize(options)
    return gin.get_configurable(entry_point)()
  except SystemExit:
    raise
  except Exception as error:  # every error: one line, the traceback in a log file
    if os.environ.get("MESHBAYES_TRACEBACK"):
      raise
    _report(prog, argv, error, model_dir, entry_point)
