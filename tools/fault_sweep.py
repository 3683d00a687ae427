"""The fault and bad-input sweep: can a run be lost, corrupted or mixed up?

  python -m meshbayes.tools.fault_sweep [--out=runs/fault_sweep] [--kills=20]
      [--sigterms=5] [--sigints=2] [--steps=200] [--sections=kill,signal,bad_input]
      [--markdown=FILE]

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

It prints one row per case (expected, observed, exit code, first line of the
error, damage) and exits 1 if any case found damage or a behaviour other than
the expected one. ``docs/reliability.md`` holds a measured table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SECTIONS = ("kill", "signal", "bad_input")
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
  rows, chain, model_dir = [], 0, None
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
    rows.append(Row(f"{name} {case + 1} at {delay:.1f} s", observed if safe else expected,
                    observed, process.returncode, "" if safe else message,
                    _unreadable(model_dir)))
  finish = subprocess.run(train_args(model_dir, steps), capture_output=True, text=True,
                          timeout=900)
  if finish.returncode != 0:
    rows.append(Row(f"{name} chain {chain} resumed to the end", "exit 0",
                    f"exit {finish.returncode}", finish.returncode, _error_line(finish.stderr)))
  rows.append(_final_row(f"{name} chain {chain}", model_dir, reference))
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
  parser.add_argument("--sections", default=",".join(SECTIONS))
  parser.add_argument("--markdown", type=Path)
  args = parser.parse_args(argv)
  sections = args.sections.split(",")
  unknown = sorted(set(sections) - set(SECTIONS))
  if unknown or args.steps < 2 * CHECKPOINT_PERIOD:
    parser.error(f"--sections={args.sections!r} must name some of {SECTIONS} and --steps="
                 f"{args.steps} must be >= {2 * CHECKPOINT_PERIOD}")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  out = args.out.resolve()
  out.mkdir(parents=True, exist_ok=True)
  rng = random.Random(args.seed)
  reference = out / "reference"
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
