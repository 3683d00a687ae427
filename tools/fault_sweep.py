"""The fault and bad-input sweep: can a run be lost, corrupted or mixed up?

  python -m meshbayes.tools.fault_sweep [--out=runs/fault_sweep] [--kills=20]
      [--sigterms=5] [--sigints=2] [--steps=200]
      [--sections=kill,signal,bad_input,issue65] [--cases=stale,method,...] [--markdown=FILE]

On the tiny synthetic Bayesian model (batch 8, a checkpoint every 4 steps):

* ``kill``: an uninterrupted reference run, then runs killed with SIGKILL at
  random moments (startup, compilation, steps, saves) and started again until
  they finish; after every kill ``inspect_checkpoint verify`` reads every
  checkpoint left, and each finished run's final state is compared with the
  reference's (``inspect_checkpoint diff``: identical, or it is damage).
* ``signal``: the same with SIGTERM and SIGINT, which must save the last
  completed step, print one line and exit 143 and 130.
* ``bad_input``: each mistake a user can make, run against a copy of a small
  trained run; the error must be one line (no traceback) and the run's
  checkpoints and ``config.gin`` must be as before.

* ``issue65``: the cases of issue 65 (``--cases`` picks some; given alone, only
  them): ``stale`` (an evaluation's files of an earlier step read with a later
  one's), ``method`` (a predictive method that does not fit the run; metrics.json
  naming its method), ``compute`` (``compute.json`` naming a checkpoint that never
  landed, after a kill -9 during its save), ``infer`` (two infers to one output at
  once), ``strict`` (bare NaN in the JSON a run, its evaluation and infer write),
  ``frictions`` (error lines that should say what to do; tracebacks in
  ``MODEL_DIR/logs`` bounded). The kill -9 rows also check ``compute.json``.

It prints one row per case (expected, observed, exit code, first line of the
error, damage) and exits 1 if any case found damage or a behaviour other than
the expected one. ``docs/reliability.md`` holds a measured table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SECTIONS = ("kill", "signal", "bad_input", "issue65")
ISSUE65_CASES = ("stale", "method", "compute", "infer", "strict", "frictions")
EXAMPLE = "gin_configs/examples/tiny_synthetic_bayesian.gin"
CHECKPOINT_PERIOD = 4


@dataclasses.dataclass
class Row:
  """One case of the sweep."""

  case: str
  expected: str
  observed: str
  exit_code: int | None
  error: str
  damage: str = "none"

  @property
  def ok(self) -> bool:
    return self.damage == "none" and self.observed == self.expected


def train_args(model_dir: Path, steps: int, *gin_files: str) -> list[str]:
  """The command line of the tiny run (no counting of the training split), from its
  example file or ``gin_files``."""
  return [sys.executable, "-m", "meshbayes.train", *(gin_files or [f"--gin_file={EXAMPLE}"]),
          f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=8",
          f"--gin.run_configs.CheckpointConfig.period={CHECKPOINT_PERIOD}", "--gin.train.log_period=4",
          "--gin.models.EncoderDecoderModel.num_train_units=450000"]


def _tool(*args: object) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "meshbayes.tools.inspect_checkpoint",
                         *map(str, args)], capture_output=True, text=True, timeout=600)


def _error_line(stderr: str) -> str:
  """The line that says what went wrong ('' when nothing did)."""
  lines = [line for line in stderr.splitlines() if line.strip()]
  errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
  return (errors or lines or [""])[0][:160]


def _whole_error_line(stderr: str) -> str:
  """The ``PROG: error: ...`` line, whole (key phrases may come after ``_error_line``'s
  first 160 characters)."""
  return next((line for line in stderr.splitlines() if "error:" in line), "")


def _one_line(stderr: str) -> bool:
  """No traceback on the console: the error is a single line."""
  return "Traceback" not in stderr and sum("error:" in line for line in stderr.splitlines()) <= 1


def _unreadable(model_dir: Path) -> str:
  """'none', or what ``inspect_checkpoint verify`` found wrong."""
  if not any(p.name.isdigit() for p in (model_dir / "checkpoints").glob("*")):
    return "none"  # killed before its first save
  verified = _tool("verify", model_dir)
  if verified.returncode == 0:
    return "none"
  return "unreadable: " + _error_line(verified.stdout + verified.stderr)


def _same_final(model_dir: Path, reference: Path) -> str:
  diff = _tool("diff", model_dir, reference)
  return "none" if diff.returncode == 0 else "final state differs from the reference"


def reference_run(model_dir: Path, steps: int) -> float:
  """The uninterrupted run; returns its wall time in seconds."""
  started = time.perf_counter()
  result = subprocess.run(train_args(model_dir, steps), capture_output=True, text=True,
                          timeout=900)
  if result.returncode != 0:
    raise SystemExit(f"fault_sweep: the reference run failed (exit {result.returncode}): "
                     f"{_error_line(result.stderr)}")
  return time.perf_counter() - started


def _interrupted_runs(out: Path, name: str, reference: Path, steps: int, run_seconds: float,
                      count: int, signum: int, expected_code: int,
                      rng: random.Random) -> list[Row]:
  """``count`` interruptions at random moments of runs restarted until they finish.

  The moment is drawn over a whole run's wall time (startup, compilation, steps and
  saves), which shrinks when a run finishes before its signal (a resumed run is shorter).
  """
  rows, chain, model_dir, compute_bad = [], 0, None, 0
  expected = "killed" if signum == signal.SIGKILL else f"exit {expected_code}, one line"
  for case in range(count):
    if model_dir is None or _finished(model_dir, steps):
      if model_dir is not None:
        rows.append(_final_row(f"{name} chain {chain}", model_dir, reference))
      chain += 1
      model_dir = out / f"{name}-{chain}"
      shutil.rmtree(model_dir, ignore_errors=True)
    delay = rng.uniform(0.0, run_seconds)
    log = out / f"{name}-{case + 1}.log"
    with log.open("w") as output:
      started = time.perf_counter()
      process = subprocess.Popen(train_args(model_dir, steps), stdout=output,
                                 stderr=subprocess.STDOUT)
      time.sleep(delay)
      finished_first = process.poll() is not None
      if finished_first:
        run_seconds = 0.8 * (time.perf_counter() - started)
      else:
        process.send_signal(signum)
      process.wait(timeout=600)
    text = log.read_text()
    if finished_first:
      observed = "finished before the signal"
    elif process.returncode == 0 and _finished(model_dir, steps):
      observed = "exit 0: signal after the last step, all saved"
    elif signum == signal.SIGKILL:
      observed = "killed"
    else:
      observed = (expected if process.returncode == expected_code and _one_line(text)
                  else f"exit {process.returncode}")
    message = "" if signum == signal.SIGKILL else _signal_line(text)
    safe = finished_first or observed.startswith("exit 0")  # nothing left to interrupt
    damage = _unreadable(model_dir)
    never_landed = compute_violations(model_dir) if signum == signal.SIGKILL else []
    if never_landed:  # issue 65: the cost log ran ahead of the checkpoint it names
      compute_bad += 1
      damage = f"compute.json: last_step {never_landed} never landed" + (
          "" if damage == "none" else f"; {damage}")
    rows.append(Row(f"{name} {case + 1} at {delay:.1f} s", observed if safe else expected,
                    observed, process.returncode, "" if safe else message, damage))
  finish = subprocess.run(train_args(model_dir, steps), capture_output=True, text=True,
                          timeout=900)
  if finish.returncode != 0:
    rows.append(Row(f"{name} chain {chain} resumed to the end", "exit 0",
                    f"exit {finish.returncode}", finish.returncode, _error_line(finish.stderr)))
  rows.append(_final_row(f"{name} chain {chain}", model_dir, reference))
  if signum == signal.SIGKILL:
    rows.append(Row(f"{name}: compute.json after every kill", "0 violations",
                    f"{compute_bad} violations", None, ""))
  return rows


def _signal_line(output: str) -> str:
  """What a run said when it stopped on a signal (its last line)."""
  lines = [line for line in output.splitlines() if line.strip()]
  return (lines or [""])[-1][:160]


def _finished(model_dir: Path, steps: int) -> bool:
  return (model_dir / "checkpoints" / str(steps)).is_dir()


def _final_row(name: str, model_dir: Path, reference: Path) -> Row:
  damage = _same_final(model_dir, reference)
  observed = "identical" if damage == "none" else "differs"
  return Row(f"{name}: final state", "identical", observed, 0, "", damage)


def eval_args(model_dir: Path, *gin_files: str) -> list[str]:
  """``meshbayes.eval`` of the tiny run on one validation batch, teacher-forced only."""
  return [sys.executable, "-m", "meshbayes.eval", "--gin_file=runs/eval.gin",
          *(gin_files or ("--gin_file=tasks/synthetic.gin",)), f"--gin.MODEL_DIR='{model_dir}'",
          "--gin.BATCH_SIZE=8", "--gin.data.TaskData.max_eval_batches=1",
          "--gin.evaluation.DecodeConfig.enabled=False"]


def infer_args(model_dir: Path) -> list[str]:
  """``meshbayes.infer`` of the tiny run on ``model_dir/../inputs.txt`` (bindings add the
  output file)."""
  return [sys.executable, "-m", "meshbayes.infer", "--gin_file=runs/infer.gin",
          "--gin_file=tasks/synthetic.gin", f"--gin.MODEL_DIR='{model_dir}'",
          "--gin.BATCH_SIZE=8", f"--gin.INPUT_FILE='{_inputs(model_dir)}'"]


def _inputs(model_dir: Path) -> Path:
  return model_dir.parent / f"{model_dir.name}-inputs.txt"


@dataclasses.dataclass(frozen=True)
class BadInput:
  """A mistake run against a copy of a small trained run.

  Attributes:
    name: the case.
    bindings: what is added to the command line (``{model_dir}`` stands for the copy).
    prepare: changes the copy first (may return the name of what it changed).
    expected: ``one-line error`` (and nothing changed), or the outcome of a case that
      must succeed.
    model_dir_is_run: whether ``MODEL_DIR`` is bound to the copy.
    entry: ``train``, ``eval``, ``infer`` (reads ``_inputs(model_dir)``, which must stay
      as it was) or ``verify`` (``inspect_checkpoint verify``).
    gin_files: the gin files instead of the run's own (``train``) or of its task (``eval``).
  """

  name: str
  bindings: tuple[str, ...] = ()
  prepare: Callable[[Path], str | None] | None = None
  expected: str = "one-line error"
  model_dir_is_run: bool = True
  entry: str = "train"
  gin_files: tuple[str, ...] = ()

  def command(self, model_dir: Path, steps: int) -> list[str]:
    """The command line of this case against ``model_dir``."""
    args = {"train": lambda: train_args(model_dir, steps + CHECKPOINT_PERIOD, *self.gin_files),
            "eval": lambda: eval_args(model_dir, *self.gin_files),
            "infer": lambda: infer_args(model_dir),
            "verify": lambda: [sys.executable, "-m", "meshbayes.tools.inspect_checkpoint",
                               "verify", str(model_dir)]}[self.entry]()
    if not self.model_dir_is_run:
      args = [a for a in args if not a.startswith("--gin.MODEL_DIR=")]
    return args + list(self.bindings)


def _flip_array_bytes(model_dir: Path) -> None:
  """Flip the middle byte of each data file of the newest checkpoint (some files hold
  bytes no array reads: one flip per file makes sure an array is hit)."""
  step_dir = max((p for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit()),
                 key=lambda p: int(p.name))
  for data_file in (step_dir / "state").glob("ocdbt.process_*/d/*"):
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data_file.write_bytes(bytes(raw))


def _half_delete_oldest(model_dir: Path) -> str:
  """What a kill during the cleanup of an old checkpoint leaves; returns its name."""
  step_dir = min((p for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit()),
                 key=lambda p: int(p.name))
  files = sorted(p for p in step_dir.rglob("*") if p.is_file())
  for path in files[: max(1, len(files) // 2)]:
    path.unlink()
  return step_dir.name


def _replace_with_file(model_dir: Path) -> None:
  shutil.rmtree(model_dir)
  model_dir.write_text("not a directory\n")


def _remove(model_dir: Path) -> None:
  shutil.rmtree(model_dir)


def _empty(model_dir: Path) -> None:
  shutil.rmtree(model_dir)
  model_dir.mkdir()


def _link_to_inputs(model_dir: Path) -> None:
  (model_dir.parent / f"{model_dir.name}-link.txt").symlink_to(_inputs(model_dir))


def _flip_manifest_byte(model_dir: Path) -> None:
  step_dir = max((p for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit()),
                 key=lambda p: int(p.name))
  manifest = step_dir / "state" / "manifest.ocdbt"
  raw = bytearray(manifest.read_bytes())
  raw[len(raw) // 2] ^= 0xFF
  manifest.write_bytes(bytes(raw))


def _needs_tatoeba(model_dir: Path) -> str | None:
  """Skips the case where the Tatoeba corpus is not prepared (``make data``)."""
  from meshbayes.data import paths  # pylint: disable=import-outside-toplevel

  return None if (paths.data_dir() / "tatoeba").is_dir() else "skip"


BAD_INPUTS = (
    BadInput("unquoted gin string", ("--gin.MODEL_DIR=runs/unquoted",), model_dir_is_run=False),
    BadInput("misspelled macro", ("--gin.TRAIN_STEP=20",)),
    BadInput("negative train steps", ("--gin.TRAIN_STEPS=-3",)),
    BadInput("mesh size as a string", ("--gin.partitioning.Partitioner.data='4'",)),
    BadInput("MODEL_DIR is a file", prepare=_replace_with_file),
    BadInput("CheckpointConfig.keep=0", ("--gin.run_configs.CheckpointConfig.keep=0",)),
    BadInput("learning rate 1e39 (non-finite state)", ("--gin.optimizers.LearningRate.base=1e39",)),
    BadInput("BATCH_SIZE changed on resume", ("--gin.BATCH_SIZE=16",)),
    BadInput("a model that does not fit the checkpoint",
             ("--gin.models.TransformerConfig.emb_dim=48",)),
    BadInput("a byte flipped in each array data file", prepare=_flip_array_bytes),
    BadInput("a half-deleted old step directory",
             ("--gin.run_configs.CheckpointConfig.keep=None",),
             prepare=_half_delete_oldest, expected="exit 0, incomplete step removed"),
    BadInput("TRAIN_STEPS=0", ("--gin.TRAIN_STEPS=0",)),
    BadInput("clip_gradient_norm=None", ("--gin.optimizers.Optimizer.clip_gradient_norm=None",)),
    BadInput("a negative learning rate", ("--gin.optimizers.LearningRate.base=-0.001",)),
    BadInput("a misspelled --gin_file", ("--gin_file=runs/trian.gin",)),
    BadInput("a task file before the run file", gin_files=(
        "--gin_file=tasks/synthetic.gin", "--gin_file=runs/train.gin",
        "--gin_file=models/tiny.gin")),
    BadInput("a mesh larger than the devices", ("--gin.partitioning.Partitioner.data=4",)),
    BadInput("eval of a missing MODEL_DIR", prepare=_remove, entry="eval"),
    BadInput("eval of an empty MODEL_DIR", prepare=_empty, entry="eval"),
    BadInput("eval on another vocabulary's task (Tatoeba)", prepare=_needs_tatoeba,
             entry="eval", gin_files=("--gin_file=tasks/tatoeba_enfr.gin",)),
    BadInput("eval on another task with the run's vocabulary", entry="eval",
             bindings=("--gin.MIXTURE_OR_TASK_NAME='synthetic_copy'",),
             expected="exit 0, noted as out-of-distribution"),
    BadInput("infer writing over its input", entry="infer",
             bindings=("--gin.OUTPUT_FILE=%INPUT_FILE",)),
    BadInput("infer writing over its input through a link", prepare=_link_to_inputs,
             entry="infer", bindings=("--gin.OUTPUT_FILE='{model_dir}-link.txt'",)),
    BadInput("infer with a batch the data axis does not divide", entry="infer",
             bindings=("--num_cpu_devices=8", "--gin.BATCH_SIZE=3",
                       "--gin.OUTPUT_FILE='/tmp/fault_sweep_unused.txt'")),
    BadInput("verify of a checkpoint with a byte flipped in its manifest", entry="verify",
             prepare=_flip_manifest_byte, expected="exit 1, one line, nothing else"),
)


def _snapshot(model_dir: Path) -> dict[str, bytes]:
  """What must survive a failed start: the configuration and the step directories."""
  if not model_dir.is_dir():
    return {}
  found = {"config.gin": (model_dir / "config.gin").read_bytes()
           if (model_dir / "config.gin").is_file() else b""}
  for path in sorted((model_dir / "checkpoints").rglob("*")):
    if path.is_file():
      found[str(path.relative_to(model_dir))] = path.read_bytes()
  return found


def _listing(model_dir: Path) -> list[Path] | None:
  """What ``model_dir`` holds (None: nothing there), but for a run's ``logs/``, where a
  failed command leaves its traceback."""
  if not model_dir.exists():
    return None
  is_run = (model_dir / "checkpoints").is_dir()
  return sorted(p for p in model_dir.rglob("*")
                if not (is_run and p.relative_to(model_dir).parts[0] == "logs"))


def bad_inputs(out: Path, base: Path, steps: int) -> list[Row]:
  """Each mistake against a copy of ``base`` (a run of ``steps`` steps)."""
  rows = []
  for case in BAD_INPUTS:
    model_dir = out / ("bad-" + "".join(c if c.isalnum() else "_" for c in case.name))
    inputs = _inputs(model_dir)
    for leftover in (model_dir, inputs, model_dir.parent / f"{model_dir.name}-link.txt"):
      if leftover.is_dir() and not leftover.is_symlink():
        shutil.rmtree(leftover)
      elif leftover.exists() or leftover.is_symlink():
        leftover.unlink()
    shutil.copytree(base, model_dir)
    inputs.write_text("5 6 7 8\n9 10 11\n")
    prepared = case.prepare(model_dir) if case.prepare else None
    if prepared == "skip":
      skipped = "skipped: no Tatoeba data (make data)"
      rows.append(Row(case.name, skipped, skipped, None, ""))
      continue
    before = _snapshot(model_dir), _listing(model_dir), inputs.read_bytes()
    command = [a.replace("{model_dir}", str(model_dir)) for a in case.command(model_dir, steps)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if case.expected.startswith("exit 0, incomplete"):
      removed = not (model_dir / "checkpoints" / str(prepared)).exists()
      observed = (f"exit {result.returncode}, incomplete step "
                  + ("removed" if removed else "left"))
      rows.append(Row(case.name, case.expected, observed, result.returncode,
                      _error_line(result.stderr), _unreadable(model_dir)))
      continue
    if case.expected.startswith("exit 0, noted"):
      noted = result.returncode == 0 and "out-of-distribution" in result.stderr
      observed = case.expected if noted else f"exit {result.returncode}"
    elif case.entry == "verify":
      quiet = result.returncode == 1 and not result.stderr and "corrupt" in result.stdout
      observed = case.expected if quiet else f"exit {result.returncode}, stderr " \
          f"{len(result.stderr.splitlines())} lines"
      result.stderr = next((line for line in result.stdout.splitlines() if "corrupt" in line),
                           "")
    else:
      observed = ("one-line error" if result.returncode not in (0, None)
                  and _one_line(result.stderr) else
                  f"exit {result.returncode}" + ("" if _one_line(result.stderr) else ", traceback"))
    after = _snapshot(model_dir), _listing(model_dir), inputs.read_bytes()
    changed = sorted(k for k, v in before[0].items() if after[0].get(k) != v)
    if before[2] != after[2]:
      changed.insert(0, inputs.name)
    if case.entry in ("eval", "infer") and not case.expected.startswith("exit 0") and \
        before[1] != after[1]:
      changed.append("files created in MODEL_DIR")
    rows.append(Row(case.name, case.expected, observed, result.returncode,
                    _error_line(result.stderr),
                    "none" if not changed else f"changed: {', '.join(changed[:3])}"))
  rows.append(_two_trainers(out, steps))
  return rows


def _two_trainers(out: Path, steps: int) -> Row:
  """A second trainer on a MODEL_DIR in use must stop with one line, harming nothing."""
  model_dir = out / "bad-two_trainers"
  shutil.rmtree(model_dir, ignore_errors=True)
  first = subprocess.Popen(train_args(model_dir, 10**6), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
  for line in first.stdout:  # the first holds the directory once it trains
    if "compilation included" in line:
      break
  second = subprocess.run(
      train_args(model_dir, steps) + ["--gin.optimizers.LearningRate.base=1e-2"],
      capture_output=True, text=True, timeout=900)
  first.send_signal(signal.SIGTERM)  # saves its last step and exits 143
  first.communicate(timeout=900)
  observed = ("one-line error" if second.returncode not in (0, None) and _one_line(second.stderr)
              else f"exit {second.returncode}")
  damage = "none" if first.returncode == 143 else f"first run exit {first.returncode}"
  if damage == "none":
    damage = _unreadable(model_dir)
  return Row("a second trainer on a MODEL_DIR in use", "one-line error", observed,
             second.returncode, _error_line(second.stderr), damage)


# --------------------------------------------------------------------------- issue 65

# The tiny run of the issue's cases: trained to STEP_A, evaluated, trained on to STEP_B.
STEP_A, STEP_B = 2 * CHECKPOINT_PERIOD, 3 * CHECKPOINT_PERIOD
EVAL_MANIFEST = "manifest.json"
# An evaluation directory's history: every evaluated step's scalars, by design.
EVAL_HISTORY = ("metrics.jsonl", "events.out.tfevents.")
FAILING_COMMANDS = 25  # failures whose tracebacks MODEL_DIR/logs must not all keep


def _loads_strict(text: str) -> object:
  """``meshbayes.runtime.strict_json.loads_strict``, or the same (json refusing NaN and
  Infinity) where the code under test has no such module."""
  try:
    from meshbayes.runtime.strict_json import loads_strict  # pylint: disable=import-outside-toplevel
  except ImportError:
    def loads_strict(text: str) -> object:
      def refuse(constant: str) -> object:
        raise ValueError(f"non-standard JSON constant {constant}")
      return json.loads(text, parse_constant=refuse)
  return loads_strict(text)


def manifest_files(manifest: object) -> set[str]:
  """The file names a manifest's ``files`` lists (names, a mapping by name, or records
  with a ``name`` or ``path``)."""
  files = manifest.get("files", ()) if isinstance(manifest, dict) else ()
  names = set()
  for entry in files:
    if isinstance(entry, dict):
      entry = entry.get("name") or entry.get("path") or ""
    names.add(Path(str(entry)).name)
  return names


def stale_set(eval_dir: Path, step: int) -> list[str]:
  """What in an evaluation directory does not belong to its evaluation of ``step``: [] when
  its ``manifest.json`` is of ``step`` and lists every file there but the history
  (``EVAL_HISTORY``)."""
  manifest_path, problems = eval_dir / EVAL_MANIFEST, []
  manifest = None
  if not manifest_path.is_file():
    problems.append(f"no {EVAL_MANIFEST}")
  else:
    manifest = json.loads(manifest_path.read_text())
    if not isinstance(manifest, dict) or manifest.get("step") != step:
      found = manifest.get("step") if isinstance(manifest, dict) else manifest
      problems.append(f"{EVAL_MANIFEST} of step {found}, not {step}")
  listed = manifest_files(manifest)
  for path in sorted(p for p in eval_dir.iterdir() if p.is_file()):
    if path.name != EVAL_MANIFEST and not path.name.startswith(EVAL_HISTORY) and \
        path.name not in listed:
      problems.append(f"{path.name} not in {EVAL_MANIFEST}")
  return problems


def landed_steps(model_dir: Path) -> list[int]:
  """The steps whose checkpoint directory landed (orbax renames a save's temporary
  directory to the step's name when it completes)."""
  found = (model_dir / "checkpoints").glob("*")
  return sorted(int(p.name) for p in found if p.name.isdigit() and p.is_dir())


def compute_violations(model_dir: Path) -> list[int]:
  """The ``last_step`` of each attempt in ``compute.json`` that no checkpoint backs: not
  landed, and no later one landed (keep=N may prune a landed one once a later lands)."""
  path = model_dir / "compute.json"
  if not path.is_file():
    return []
  landed = landed_steps(model_dir)
  return [attempt["last_step"] for attempt in json.loads(path.read_text())
          if attempt["last_step"] not in landed
          and not any(step > attempt["last_step"] for step in landed)]


def strict_json_problems(paths: Sequence[Path]) -> list[str]:
  """Each JSON (``.json``) or JSON-lines (``.jsonl``) file of ``paths`` that a strict
  reader refuses, with why (the first refused line of a JSON-lines file)."""
  problems = []
  for path in paths:
    text = path.read_text()
    chunks = ([(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
              if path.suffix == ".jsonl" else [(0, text)])
    for number, chunk in chunks:
      try:
        _loads_strict(chunk)
      except ValueError as error:
        where = f"{path.name}:{number}" if number else path.name
        problems.append(f"{where}: {str(error).splitlines()[0][:80]}")
        break
  return problems


def infer_pairing(output: Path, num_inputs: int) -> list[str]:
  """What is wrong with an infer's output and its scores as one result of ``num_inputs``
  lines: every scores record's ``output`` is the text's line of the same number."""
  scores = Path(str(output) + ".scores.jsonl")
  if not output.is_file() or not scores.is_file():
    return [f"missing: {output.name if not output.is_file() else scores.name}"]
  texts = output.read_text().split("\n")[:-1]
  records = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
  problems = [f"{len(texts)} text lines and {len(records)} scores for {num_inputs} inputs"
              ] if not len(texts) == len(records) == num_inputs else []
  differing = [n for n, (text, record) in enumerate(zip(texts, records), 1)
               if record.get("output") != text]
  if differing:
    problems.append(f"{len(differing)} lines whose scores are of another text (first: line "
                    f"{differing[0]})")
  return problems


def _run_quiet(command: Sequence[str], timeout: int = 900) -> subprocess.CompletedProcess:
  return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)


def _decoded_eval_args(model_dir: Path, *bindings: str) -> list[str]:
  """``eval_args`` with decoding (the default ``DecodeConfig``)."""
  return [a for a in eval_args(model_dir) if not a.startswith("--gin.evaluation.DecodeConfig.")
          ] + list(bindings)


def _fresh(path: Path) -> Path:
  if path.is_dir():
    shutil.rmtree(path)
  elif path.exists():
    path.unlink()
  return path


class Issue65:
  """The cases of issue 65, sharing a tiny run (trained lazily) and its decoded evaluation."""

  def __init__(self, out: Path):
    self.out = out
    self._run: Path | None = None
    self._decoded: Path | None = None
    self._decoded_result: subprocess.CompletedProcess | None = None

  def _copy(self, source: Path, name: str) -> Path:
    target = _fresh(self.out / f"i65-{name}")
    shutil.copytree(source, target)
    return target

  def run(self) -> Path:
    """The tiny run trained to ``STEP_A``."""
    if self._run is None:
      self._run = _fresh(self.out / "i65-run")
      result = _run_quiet(train_args(self._run, STEP_A))
      if result.returncode != 0:
        raise SystemExit(f"fault_sweep: the tiny run failed (exit {result.returncode}): "
                         f"{_error_line(result.stderr)}")
    return self._run

  def decoded(self) -> tuple[Path, subprocess.CompletedProcess]:
    """A copy of ``run()`` evaluated with decoding at ``STEP_A``, and that evaluation."""
    if self._decoded is None:
      self._decoded = self._copy(self.run(), "decoded")
      self._decoded_result = _run_quiet(_decoded_eval_args(self._decoded))
    return self._decoded, self._decoded_result

  def rows(self, cases: Sequence[str]) -> list[Row]:
    rows = []
    for case in cases:
      print(f"fault_sweep: issue 65, {case}...", flush=True)
      rows += getattr(self, f"case_{case}")()
    return rows

  # 1. An evaluation's files of step A read with those of step B.
  def case_stale(self) -> list[Row]:
    decoded, first = self.decoded()
    name = "#65 stale: eval at A decoded, at B not"
    if first.returncode != 0:
      return [Row(name, "B's files alone", f"eval at A exit {first.returncode}",
                  first.returncode, _error_line(first.stderr))]
    model_dir = self._copy(decoded, "stale")
    trained = _run_quiet(train_args(model_dir, STEP_B))
    second = _run_quiet(eval_args(model_dir)) if trained.returncode == 0 else trained
    if second.returncode != 0:
      return [Row(name, "B's files alone", f"exit {second.returncode} at B",
                  second.returncode, _error_line(second.stderr))]
    eval_dir = next(p for p in (model_dir / "eval").iterdir() if p.is_dir())  # eval/<task>
    problems = stale_set(eval_dir, STEP_B)
    read = _read_items(eval_dir, "model_average")
    if read.get("decoded"):
      problems.insert(0, "read_items paired A's predictions with B's statistics")
    elif "refused" in read and "\n" in read["refused"].strip():
      problems.insert(0, "read_items refused in more than one line")
    observed = "B's files alone" if not problems else "; ".join(problems[:4]) + (
        f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")
    return [Row(name, "B's files alone", observed, second.returncode,
                read.get("refused", read.get("error", "")).split("\n")[0][:160])]

  # 2. A predictive method that does not fit the run.
  def case_method(self) -> list[Row]:
    rows = []
    for method in ("ivon", "deterministic"):
      model_dir = self._copy(self.run(), f"method-{method}")
      before = _listing(model_dir)
      result = _run_quiet(eval_args(model_dir) + [
          f"--gin.evaluation.PredictiveConfig.method='{method}'"])
      line = _error_line(result.stderr)
      names_fitting = re.search(r"\bbayesian\b", _whole_error_line(result.stderr)) is not None
      if result.returncode == 1 and _one_line(result.stderr) and names_fitting:
        observed = "one-line error naming the methods that apply"
      elif result.returncode == 1 and _one_line(result.stderr):
        observed = "one-line error, no method that applies named"
      else:
        observed = f"exit {result.returncode}" + ("" if _one_line(result.stderr)
                                                  else ", traceback")
      written = "none" if _listing(model_dir) == before else "files created in MODEL_DIR"
      rows.append(Row(f"#65 method '{method}' on the Bayesian run",
                      "one-line error naming the methods that apply", observed,
                      result.returncode, line if result.returncode else "", written))
    decoded, result = self.decoded()
    metrics_files = sorted((decoded / "eval").glob("*/metrics.json"))
    has_method = bool(metrics_files) and "method" in json.loads(metrics_files[0].read_text(),
                                                                parse_constant=float)
    rows.append(Row("#65 metrics.json names its method", "has 'method'",
                    "has 'method'" if has_method else "no 'method' key" if metrics_files
                    else "no metrics.json", result.returncode,
                    _error_line(result.stderr) if result.returncode else ""))
    return rows

  # 3. compute.json naming a checkpoint that did not land.
  def case_compute(self, kills: int = 3) -> list[Row]:
    """kill -9 while a save is in flight: as soon as compute.json names the step being
    saved, or when that save lands, whichever comes first."""
    model_dir = _fresh(self.out / "i65-compute")
    steps, rows, violations, in_flight = 10**6, [], 0, 0
    for attempt in range(1, kills + 1):
      process = subprocess.Popen(train_args(model_dir, steps), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
      saving = _kill_during_save(process, model_dir, after=max(landed_steps(model_dir),
                                                               default=0))
      process.wait(timeout=600)
      bad = compute_violations(model_dir)
      violations += bool(bad)
      in_flight += saving is not None
      rows.append(Row(f"#65 compute.json: kill -9 {attempt} during the save of step {saving}",
                      "killed", "killed" if process.returncode == -signal.SIGKILL else
                      f"exit {process.returncode}", process.returncode, "",
                      _unreadable(model_dir) if not bad else
                      f"compute.json: last_step {bad} never landed"))
    rows.append(Row("#65 compute.json after kill -9 during saves", "0 violations",
                    f"{violations} violations" + ("" if in_flight == kills else
                                                  f" ({kills - in_flight} kills not in a save)"),
                    None, ""))
    return rows

  # 4. Two infers to the same output at once.
  def case_infer(self, num_lines: int = 2000) -> list[Row]:
    """The first infer is stopped (SIGSTOP) once its progress bar shows a batch done, so
    that it holds the output, alive, for as long as the second runs; then it goes on."""
    model_dir = self.run()
    big, small = self.out / "i65-infer-big.txt", self.out / "i65-infer-small.txt"
    rng = random.Random(65)
    big.write_text("".join(" ".join(str(rng.randint(2, 30)) for _ in range(rng.randint(4, 8)))
                           + "\n" for _ in range(num_lines)))
    small.write_text("5 6 7 8\n9 10 11\n")
    output = _fresh(self.out / "i65-infer-out.txt")
    _fresh(Path(str(output) + ".scores.jsonl"))
    command = [a for a in infer_args(model_dir) if not a.startswith("--gin.INPUT_FILE=")]
    first = subprocess.Popen(command + [f"--gin.INPUT_FILE='{big}'",
                                        f"--gin.OUTPUT_FILE='{output}'"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    progress = _Progress(first)
    progress.wait_for_first_batch()
    overlapped = first.poll() is None
    if overlapped:
      first.send_signal(signal.SIGSTOP)
    try:
      second = _run_quiet(command + [f"--gin.INPUT_FILE='{small}'",
                                     f"--gin.OUTPUT_FILE='{output}'"])
    finally:
      if overlapped:
        first.send_signal(signal.SIGCONT)
    first.wait(timeout=1800)
    progress.join()
    expected = "second: one-line error; first: exit 0, text and scores agree"
    problems = infer_pairing(output, num_lines)
    refused = second.returncode not in (0, None) and _one_line(second.stderr)
    if not overlapped:
      observed = "not overlapped (the first finished before its first progress line)"
    else:
      observed = ("second: one-line error" if refused else f"second: exit {second.returncode}"
                  ) + f"; first: exit {first.returncode}, " + (
                      "text and scores agree" if not problems else "; ".join(problems))
    return [Row("#65 two infers to one output at once", expected, observed, second.returncode,
                _error_line(second.stderr) if second.returncode else "")]

  # 5. Strict JSON.
  def case_strict(self) -> list[Row]:
    decoded, result = self.decoded()
    output = _fresh(self.out / "i65-strict-out.txt")
    inputs = _inputs(decoded)
    inputs.write_text("5 6 7 8\n9 10 11\n")
    infer = _run_quiet(infer_args(decoded) + [f"--gin.OUTPUT_FILE='{output}'"])
    paths = sorted(p for p in decoded.rglob("*") if p.is_file() and p.suffix in (".json",
                                                                                 ".jsonl"))
    paths += sorted(p for p in output.parent.glob(output.name + "*")
                    if p.suffix in (".json", ".jsonl"))
    problems = strict_json_problems(paths)
    observed = (f"{len(paths)} files strict" if not problems else
                f"{len(problems)} of {len(paths)} files not strict: " + "; ".join(problems[:3]))
    failed = next((r for r in (result, infer) if r.returncode != 0), None)
    return [Row("#65 strict JSON of a run, its eval and infer", f"{len(paths)} files strict",
                observed if failed is None else f"exit {failed.returncode}",
                failed.returncode if failed else 0,
                _error_line(failed.stderr) if failed else "")]

  # 6. Error lines that should say what to do.
  def case_frictions(self) -> list[Row]:
    run = self.run()
    no_checkpoint = _fresh(self.out / "i65-no-checkpoint")
    (no_checkpoint / "checkpoints").mkdir(parents=True)
    shutil.copy(run / "config.gin", no_checkpoint / "config.gin")
    corrupt = self._copy(run, "corrupt")
    _flip_array_bytes(corrupt)
    checks = (
        ("#65 eval --gin.evalute.checkpoint_step=3", self._copy(run, "typo"),
         eval_args, ("--gin.evalute.checkpoint_step=3",),
         lambda line: "did you mean" in line and "evaluate" in line, "'did you mean evaluate'"),
        ("#65 eval: a renamed setting, unquoted (evaluate.output_dir=runs/x)",
         self._copy(run, "renamed"), eval_args, ("--gin.evaluate.output_dir=runs/x",),
         lambda line: "ReportConfig.output_dir" in line and "quote" in line.lower(),
         "names the new name and the quotes"),
        ("#65 eval of a run with no checkpoint", no_checkpoint, eval_args, (),
         lambda line: "make demo" in line or "meshbayes.train" in line,
         "names how to get one"),
        ("#65 train on a corrupt newest checkpoint", corrupt,
         lambda d: train_args(d, STEP_A + CHECKPOINT_PERIOD), (),
         lambda line: "fallback_on_corrupt" in line, "names fallback_on_corrupt"),
    )
    rows = []
    for name, model_dir, args, bindings, says, expected in checks:
      result = _run_quiet(args(model_dir) + list(bindings))
      line = _error_line(result.stderr)
      one = result.returncode not in (0, None) and _one_line(result.stderr)
      observed = (f"one-line error, {expected}" if one and says(_whole_error_line(result.stderr))
                  else
                  "one-line error, not saying it" if one else f"exit {result.returncode}")
      rows.append(Row(name, f"one-line error, {expected}", observed, result.returncode, line))
    rows.append(self._logs_bounded())
    return rows

  def _logs_bounded(self) -> Row:
    """``FAILING_COMMANDS`` failing evaluations (two at a time: no lock between them) of a
    checkpoint the run lacks: its logs/ must not keep a traceback of each."""
    model_dir = self._copy(self.run(), "logs")
    command = eval_args(model_dir) + ["--gin.evaluate.checkpoint_step=3"]
    codes = []
    for start in range(0, FAILING_COMMANDS, 2):
      pair = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for _ in range(min(2, FAILING_COMMANDS - start))]
      codes += [process.wait(timeout=600) for process in pair]
    logs = list((model_dir / "logs").glob("*")) if (model_dir / "logs").is_dir() else []
    failed = sum(code != 0 for code in codes)
    expected = f"fewer than {FAILING_COMMANDS} log files"
    observed = (expected if len(logs) < FAILING_COMMANDS else f"{len(logs)} log files"
                ) if failed == FAILING_COMMANDS else f"{FAILING_COMMANDS - failed} did not fail"
    return Row(f"#65 {FAILING_COMMANDS} failing commands: MODEL_DIR/logs bounded", expected,
               observed, None, f"{len(logs)} files in logs/ after {failed} failures")


def _read_items(eval_dir: Path, predictive: str) -> dict[str, object]:
  """``read_items(eval_dir, predictive)`` of the code under test, in a child process:
  ``{'decoded': bool}``, ``{'refused': its error}`` or ``{'error': ...}``."""
  code = ("import json, sys\n"
          "from meshbayes.evaluation.items import read_items\n"
          "try:\n"
          "  items = read_items(sys.argv[1], sys.argv[2])\n"
          "except Exception as error:\n"
          "  print(json.dumps({'refused': f'{type(error).__name__}: {error}'}))\n"
          "else:\n"
          "  print(json.dumps({'decoded': items.decoded}))\n")
  result = _run_quiet([sys.executable, "-c", code, str(eval_dir), predictive], timeout=300)
  lines = result.stdout.strip().splitlines()
  return json.loads(lines[-1]) if result.returncode == 0 and lines else {
      "error": _error_line(result.stderr)}


def _kill_during_save(process: subprocess.Popen, model_dir: Path, after: int) -> int | None:
  """Waits for a save of a step above ``after`` to start (its temporary directory), then
  kills ``process`` with SIGKILL once compute.json names that step or the save lands;
  returns the step (None: the process ended first, or no save was seen in 10 minutes)."""
  deadline, step = time.monotonic() + 600, None
  while process.poll() is None and time.monotonic() < deadline:
    if step is None:
      found = [int(m.group(1)) for p in (model_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*")
               if (m := re.match(r"(\d+)\.", p.name))]
      step = next((s for s in sorted(found) if s > after), None)
    if step is not None:
      recorded = _recorded_last_step(model_dir)
      if recorded == step or step in landed_steps(model_dir):
        process.kill()
        return step
    time.sleep(0.002)
  if process.poll() is None:
    process.kill()
  return None


def _recorded_last_step(model_dir: Path) -> int | None:
  try:
    return json.loads((model_dir / "compute.json").read_text())[-1]["last_step"]
  except (OSError, ValueError, IndexError, KeyError):
    return None  # not written yet, or being replaced


class _Progress:
  """Reads a child's stderr (tqdm progress, carriage returns) as it comes."""

  _DONE = re.compile(r"\|\s*[1-9]\d*/\d+ \[")

  def __init__(self, process: subprocess.Popen):
    self.text, self._seen = "", threading.Event()
    self._thread = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
    self._thread.start()

  def _read(self, stream) -> None:
    while chunk := stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096):
      self.text += chunk.decode(errors="replace")
      if self._DONE.search(self.text[-4096:]):
        self._seen.set()
    self._seen.set()  # ended: nothing more to wait for

  def wait_for_first_batch(self) -> None:
    """Until a progress line says a batch is done (or the process ended)."""
    self._seen.wait(timeout=900)

  def join(self) -> None:
    self._thread.join(timeout=60)


def markdown(rows: Sequence[Row]) -> str:
  lines = ["| case | expected | observed | exit | first line of the error | damage |",
           "|---|---|---|---|---|---|"]
  for row in rows:
    error = row.error.replace("|", "\\|")
    lines.append(f"| {row.case} | {row.expected} | {row.observed} | {row.exit_code} | "
                 f"{error} | {row.damage} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="fault_sweep", description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="runs/fault_sweep", type=Path)
  parser.add_argument("--kills", type=int, default=20)
  parser.add_argument("--sigterms", type=int, default=5)
  parser.add_argument("--sigints", type=int, default=2)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--seed", type=int, default=0)
  # --cases alone: only those of issue 65.
  parser.add_argument("--sections")
  parser.add_argument("--cases", help=f"some of {','.join(ISSUE65_CASES)} (section issue65)")
  parser.add_argument("--markdown", type=Path)
  args = parser.parse_args(argv)
  sections = (args.sections or ("issue65" if args.cases else ",".join(SECTIONS))).split(",")
  cases = (args.cases or ",".join(ISSUE65_CASES)).split(",")
  if set(sections) - set(SECTIONS) or args.steps < 2 * CHECKPOINT_PERIOD:
    parser.error(f"--sections={args.sections!r} must name some of {SECTIONS} and --steps="
                 f"{args.steps} must be >= {2 * CHECKPOINT_PERIOD}")
  if set(cases) - set(ISSUE65_CASES):
    parser.error(f"--cases={args.cases!r} must name some of {', '.join(ISSUE65_CASES)}")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  out = args.out.resolve()
  out.mkdir(parents=True, exist_ok=True)
  rng = random.Random(args.seed)
  reference = out / "reference"
  if set(sections) - {"issue65"}:  # the issue's cases train their own tiny run
    shutil.rmtree(reference, ignore_errors=True)
    print(f"fault_sweep: the uninterrupted reference run ({args.steps} steps)...", flush=True)
    run_seconds = reference_run(reference, args.steps)
    print(f"fault_sweep: {run_seconds:.1f} s uninterrupted", flush=True)
  rows: list[Row] = []
  plan = {"kill": [("kill -9", args.kills, signal.SIGKILL, -signal.SIGKILL)],
          "signal": [("SIGTERM", args.sigterms, signal.SIGTERM, 143),
                     ("SIGINT", args.sigints, signal.SIGINT, 130)]}
  for section in sections:
    if section == "bad_input":
      print("fault_sweep: bad inputs...", flush=True)
      rows += bad_inputs(out, reference, args.steps)
      continue
    if section == "issue65":
      rows += Issue65(out).rows(cases)
      continue
    for name, count, signum, code in plan[section]:
      if count:
        print(f"fault_sweep: {count} x {name}...", flush=True)
        rows += _interrupted_runs(out, name.replace(" ", ""), reference, args.steps,
                                  run_seconds, count, signum, code, rng)
  table = markdown(rows)
  print(table)
  if args.markdown:
    args.markdown.write_text(table + "\n")
  bad = [row for row in rows if not row.ok]
  print(f"fault_sweep: {len(rows)} cases, {len(bad)} not as expected or with damage")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
