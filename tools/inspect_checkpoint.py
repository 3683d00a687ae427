"""Look inside meshbayes checkpoints.

  python -m meshbayes.tools.inspect_checkpoint list MODEL_DIR
  python -m meshbayes.tools.inspect_checkpoint show MODEL_DIR [--step N]
  python -m meshbayes.tools.inspect_checkpoint diff DIR_A DIR_B [--step N]
  python -m meshbayes.tools.inspect_checkpoint verify MODEL_DIR

``list`` prints the saved steps with their input position (batches consumed,
and the input shards whose iterator state is saved), or ``incomplete`` and the
files a step directory lacks; ``verify`` reads every step and checks its arrays
against their checksums, one line per step (``ok``, ``corrupt: <array>``,
``incomplete``, ``no checksums``), exiting 1 when any step is corrupt or
incomplete; ``show`` every parameter's shape, dtype,
logical axes and bytes, and per layer the posterior standard deviations
(of Bayesian layers, or of an IVON run's posterior from its optimizer state);
``diff`` the largest absolute difference of every array of two checkpoints
(parameters and optimizer state), exiting 0 only when all are identical.
Arrays are read onto this host's first device and verified against their checksums.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

from meshbayes.training import checkpoint_integrity, checkpoints
from meshbayes.training.posterior_diagnostics import posterior_moments


def _bytes(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
    n /= 1024
  raise AssertionError


def _incomplete(step_dir) -> str | None:
  missing = checkpoints.missing_parts(step_dir)
  return f"incomplete (no {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})" \
      if missing else None


def list_steps(model_dir: str) -> str:
  root = checkpoints.find_step_dir(model_dir).parent
  lines = [f"checkpoints in {root}:"]
  for step_dir in checkpoints.step_dirs(root):
    if incomplete := _incomplete(step_dir):
      lines.append(f"  step {int(step_dir.name):>8}  {incomplete}")
      continue
    meta = checkpoints.read_meta(step_dir)
    saved = len(checkpoints.input_state_names(step_dir))
    states = (f"iterator state of {saved} of {meta.get('input_shards', 1)} input shards" if saved
              else "no iterator state: a resume skips batches")
    lines.append(f"  step {int(step_dir.name):>8}  (input position: {meta.get('data_position')} "
                 f"batches; {states})")
  return "\n".join(lines)


def show(model_dir: str, step: int | None) -> str:
  step_dir = checkpoints.find_step_dir(model_dir, step)
  meta = checkpoints.read_meta(step_dir)
  axes = meta.get("param_logical_axes", {})
  saved = checkpoints.read_arrays(step_dir)
  arrays = {k[len("params/"):]: v for k, v in saved.items() if k.startswith("params/")}
  width = max(len(name) for name in arrays)
  lines = [f"checkpoint {step_dir}: {len(arrays)} parameter arrays, "
           f"{sum(v.size for v in arrays.values()):,} elements, "
           f"{_bytes(sum(v.nbytes for v in arrays.values()))}",
           f"{'parameter':<{width}}  {'shape':<22} {'dtype':<8} {'logical axes':<36} {'bytes':>10}"]
  for name, value in arrays.items():
    logical = "(" + ", ".join(a or "-" for a in axes.get(name, [])) + ")"
    lines.append(f"{name:<{width}}  {value.shape!s:<22} {value.dtype!s:<8} "
                 f"{logical:<36} {_bytes(value.nbytes):>10}")
  title, moments = posterior_moments(saved, meta)
  stddevs = {name: stddev for name, (_, stddev) in moments.items()}
  if stddevs:
    lines += ["", title, f"{'weight':<{width}}  {'mean':>10} {'min':>10} {'max':>10}"]
    for name, stddev in stddevs.items():
      lines.append(f"{name:<{width}}  {stddev.mean():>10.4g} {stddev.min():>10.4g} "
                   f"{stddev.max():>10.4g}")
  return "\n".join(lines)


def diff(dir_a: str, dir_b: str, step: int | None) -> tuple[str, bool]:
  a = checkpoints.read_arrays(checkpoints.find_step_dir(dir_a, step))
  b = checkpoints.read_arrays(checkpoints.find_step_dir(dir_b, step))
  identical = a.keys() == b.keys()
  lines = [f"only in {dir_a}: {name}" for name in sorted(a.keys() - b.keys())]
  lines += [f"only in {dir_b}: {name}" for name in sorted(b.keys() - a.keys())]
  width = max(len(name) for name in a)
  for name in sorted(a.keys() & b.keys()):
    if a[name].shape != b[name].shape:
      lines.append(f"{name:<{width}}  shapes differ: {a[name].shape} vs {b[name].shape}")
      identical = False
      continue
    difference = np.max(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)),
                        initial=0.0)
    identical &= bool(np.array_equal(a[name], b[name]))
    lines.append(f"{name:<{width}}  max |difference| {difference:.3g}")
  lines.append("identical" if identical else "different")
  return "\n".join(lines), identical


def verify(model_dir: str) -> tuple[str, bool]:
  """One line per step of ``model_dir``'s checkpoints, and whether every one can be trusted."""
  root = checkpoints.find_step_dir(model_dir).parent
  lines, trusted = [f"checkpoints in {root}:"], True
  for step_dir in checkpoints.step_dirs(root):
    status = _incomplete(step_dir)
    if status is None:
      try:
        checkpoints.read_arrays(step_dir)
        status = ("ok" if checkpoint_integrity.CHECKSUMS_KEY in checkpoints.read_meta(step_dir)
                  else "no checksums (saved before they were written)")
      except checkpoints.CorruptCheckpointError as error:
        status = (f"corrupt: {', '.join(error.arrays)} (checksum mismatch)" if error.arrays
                  else f"corrupt: {error}")
    trusted &= not status.startswith(("corrupt", "incomplete"))
    lines.append(f"  step {int(step_dir.name):>8}  {status}")
  return "\n".join(lines), trusted


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  commands.add_parser("list").add_argument("model_dir")
  show_parser = commands.add_parser("show")
  show_parser.add_argument("model_dir")
  show_parser.add_argument("--step", type=int)
  diff_parser = commands.add_parser("diff")
  diff_parser.add_argument("dir_a")
  diff_parser.add_argument("dir_b")
  diff_parser.add_argument("--step", type=int)
  commands.add_parser("verify").add_argument("model_dir")
  args = parser.parse_args(argv)
  try:
    if args.command == "list":
      print(list_steps(args.model_dir))
    elif args.command == "show":
      print(show(args.model_dir, args.step))
    elif args.command == "verify":
      text, trusted = verify(args.model_dir)
      print(text)
      return 0 if trusted else 1
    else:
      text, identical = diff(args.dir_a, args.dir_b, args.step)
      print(text)
      return 0 if identical else 1
  except checkpoints.CheckpointError as error:
    print(f"inspect_checkpoint: error: {error}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
