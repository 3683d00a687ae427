"""The frozen GPU step-time model against the steps measured on an H200, on deviceless compiles.

Builds the code that was measured (``scaling.measured_steps.MEASURED_COMMIT``,
from this repository's git history, installed without dependencies into a
temporary folder), compiles each measured step of ``H200_STEPS`` for an H200
without a GPU (``tools/deviceless_compile.py`` under that code, with
``targets.GPU_COMPILER_OPTIONS`` unless ``--triton_gemm``), and sets
``roofline.FROZEN_GPU_MODEL``'s prediction from each program against the
measured seconds. Needs JAX's CUDA plugin (the ``gpu-aot`` extra) and git.

  python -m meshbayes.tools.gpu_model_check --json=runs/gpu_model_check.json \\
      [--hlo_dir=tests/scaling/data/h200_deviceless] [--triton_gemm]

Prints a markdown table; ``ok`` (and the exit status) says whether every
prediction is within ``--tolerance`` (10%) of the measured step.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshbayes.runtime import strict_json
from meshbayes.scaling import hlo_profile, roofline, targets
from meshbayes.scaling.measured_steps import H200_STEPS, MEASURED_COMMIT, MeasuredStep

DEVICELESS_COMPILE = Path(__file__).with_name("deviceless_compile.py")


def install_commit(commit: str, repository: Path, folder: Path) -> Path:
  """``commit`` of ``repository`` installed (no dependencies) under ``folder``; its site dir."""
  source, site = folder / "source", folder / "site"
  source.mkdir(parents=True)
  archive = subprocess.run(["git", "-C", str(repository), "archive", commit],
                           capture_output=True, check=True).stdout
  subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
  subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                  "--no-build-isolation", "--target", str(site), str(source)], check=True)
  return site


def compile_step(step: MeasuredStep, site: Path | None, hlo_path: Path,
                 compiler_options: dict[str, Any]) -> dict[str, Any]:
  """Compiles ``step`` for one H200 under the code at ``site`` (None: this code)."""
  request = {"spec": step.spec_fields(), "target_config": targets.gpu_target_config("h200"),
             "compiler_options": compiler_options, "hlo": str(hlo_path)}
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  if site is not None:
    env["PYTHONPATH"] = str(site)
  # A non-finite setting is an error here, not a null the compile would read as unset.
  argument = json.dumps(request, allow_nan=False)
  done = subprocess.run([sys.executable, str(DEVICELESS_COMPILE), argument], env=env,
                        capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"deviceless compile of {step.name} failed: {done.stderr[-2000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def predict(step: MeasuredStep, hlo_text: str) -> dict[str, Any]:
  """The frozen model's (and the bare roofline's) seconds for one program against the measured."""
  record = hlo_profile.program_record(
      hlo_text, "h200", batch_size=step.batch_size, input_length=step.length,
      target_length=step.length, model_flops_per_device=step.traced_matmul_flops)
  frozen = roofline.predict(record)
  bare = roofline.predict(record, gpu_model=None)
  operations = record["operations_per_device"]
  return {"name": step.name, "measured_seconds": step.seconds,
          "predicted_seconds": frozen.step_seconds,
          "error": frozen.step_seconds / step.seconds - 1,
          "roofline_seconds": bare.step_seconds,
          "matmul_seconds": frozen.compute_seconds, "memory_seconds": frozen.memory_seconds,
          "kernel_seconds": frozen.kernel_seconds,
          "kernels": sum(entry["executed"] for entry in operations.values()),
          "hbm_bytes": sum(entry["bytes"] for entry in operations.values()),
          "matmul_flops": record["flops_per_device"]}


def markdown(rows: Sequence[dict[str, Any]]) -> str:
  lines = ["| step | measured s | predicted s | error | bare roofline s | matmul / other / "
           "kernels ms | kernels | HBM GB |", "|---|---:|---:|---:|---:|---|---:|---:|"]
  for r in rows:
    lines.append(
        f"| {r['name']} | {r['measured_seconds']:.4f} | {r['predicted_seconds']:.4f} "
        f"| {r['error']:+.1%} | {r['roofline_seconds']:.4f} | {r['matmul_seconds'] * 1e3:.1f} / "
        f"{r['memory_seconds'] * 1e3:.1f} / {r['kernel_seconds'] * 1e3:.1f} "
        f"| {r['kernels']:,.0f} | {r['hbm_bytes'] / 1e9:.1f} |")
  return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", required=True, help="the report's path")
  parser.add_argument("--commit", default=MEASURED_COMMIT,
                      help="the code to compile (default: the measured commit)")
  parser.add_argument("--repository", default=str(Path(__file__).resolve().parents[1]),
                      help="the git checkout that holds --commit")
  parser.add_argument("--hlo_dir", default=None,
                      help="keep the compiled programs here (NAME.hlo.txt.gz)")
  parser.add_argument("--steps", default=",".join(s.name for s in H200_STEPS),
                      help="comma-separated measured steps to check")
  parser.add_argument("--triton_gemm", action="store_true",
                      help="leave XLA's deviceless default (Triton for every matmul)")
  parser.add_argument("--tolerance", type=float, default=0.10)
  args = parser.parse_args(argv)
  known = {s.name: s for s in H200_STEPS}
  unknown = [n for n in args.steps.split(",") if n not in known]
  if unknown:
    parser.error(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
  args.steps = [known[n] for n in args.steps.split(",")]
  if not targets.gpu_aot_available():
    parser.error("JAX's CUDA plugin is not installed: run this in the gpu-aot venv "
                 "(make test-gpu-aot makes it)")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  options = {} if args.triton_gemm else dict(targets.GPU_COMPILER_OPTIONS)
  rows, memory = [], {}
  with tempfile.TemporaryDirectory(prefix="gpu_model_check-") as work:
    site = install_commit(args.commit, Path(args.repository), Path(work))
    hlo_dir = Path(args.hlo_dir or work)
    hlo_dir.mkdir(parents=True, exist_ok=True)
    for step in args.steps:
      path = hlo_dir / f"{step.name}.hlo.txt.gz"
      memory[step.name] = compile_step(step, site, path, options)
      rows.append(predict(step, gzip.decompress(path.read_bytes()).decode()))
      print(f"{step.name}: predicted {rows[-1]['predicted_seconds']:.4f} s, measured "
            f"{step.seconds:.4f} s ({rows[-1]['error']:+.1%})", flush=True)
  report = {"commit": args.commit, "compiler_options": options,
            "model": dataclasses.asdict(roofline.FROZEN_GPU_MODEL), "tolerance": args.tolerance,
            "steps": rows, "memory": memory,
            "ok": all(abs(r["error"]) <= args.tolerance for r in rows)}
  Path(args.json).parent.mkdir(parents=True, exist_ok=True)
  text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=1)
  Path(args.json).write_text(text + "\n")
  print(markdown(rows) + f"ok: {report['ok']}")
  return report


if __name__ == "__main__":
  sys.exit(0 if main()["ok"] else 1)
