"""A frozen GPU step-time model against the steps measured on an H200, on deviceless compiles.

``check`` builds the code that was measured (each step's commit, or one given, from a
git checkout's history, installed without dependencies into a temporary folder),
compiles each measured step for an H200 without a GPU (the script
``tools/deviceless_compile.py`` run under that code) and sets a frozen model's
prediction (``roofline.FROZEN_GPU_MODEL``, v1, unless another is given) from each
program against the measured seconds. Needs JAX's CUDA plugin (the ``gpu-aot`` extra)
and git.
"""

from __future__ import annotations

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

from meshbayes.scaling import fused_attention, roofline, targets
from meshbayes.scaling.measured_steps import MeasuredStep


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
                 compiler_options: dict[str, Any], script: Path) -> dict[str, Any]:
  """Compiles ``step`` for one H200 with ``script`` (``tools/deviceless_compile.py``) under
  the code at ``site`` (None: this code): XLA's memory analysis and the compile seconds.

  Raises:
    RuntimeError: the compile failed (the end of its stderr).
  """
  request = {"spec": step.spec_fields(), "target_config": targets.gpu_target_config("h200"),
             "compiler_options": compiler_options, "hlo": str(hlo_path)}
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  if site is not None:
    env["PYTHONPATH"] = str(site)
  # A non-finite setting is an error here, not a null the compile would read as unset.
  argument = json.dumps(request, allow_nan=False)
  done = subprocess.run([sys.executable, str(script), argument], env=env,
                        capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"deviceless compile of {step.name} failed: {done.stderr[-2000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def predict(step: MeasuredStep, hlo_text: str,
            model: roofline.GpuStepModel = roofline.FROZEN_GPU_MODEL) -> dict[str, Any]:
  """A frozen model's (and the bare roofline's) seconds for one program against the measured."""
  record = fused_attention.program_record(
      hlo_text, "h200", batch_size=step.batch_size, input_length=step.length,
      target_length=step.length, model_flops_per_device=step.traced_matmul_flops)
  frozen = roofline.predict(record, gpu_model=model)
  bare = roofline.predict(record, gpu_model=None)
  operations = record["operations_per_device"]
  return {"name": step.name, "measured_seconds": step.seconds,
          "predicted_seconds": frozen.step_seconds,
          "error": frozen.step_seconds / step.seconds - 1,
          "roofline_seconds": bare.step_seconds,
          "matmul_seconds": frozen.compute_seconds, "memory_seconds": frozen.memory_seconds,
          "kernel_seconds": frozen.kernel_seconds,
          "attention_seconds": frozen.attention_seconds,
          "kernels": sum(entry["executed"] for entry in operations.values()),
          "hbm_bytes": sum(entry["bytes"] for entry in operations.values()),
          "matmul_flops": record["flops_per_device"]}


def markdown(rows: Sequence[dict[str, Any]]) -> str:
  """A table of each step's measured and predicted seconds and the prediction's parts."""
  lines = ["| step | measured s | predicted s | error | bare roofline s | matmul / other / "
           "kernels ms | kernels | HBM GB |", "|---|---:|---:|---:|---:|---|---:|---:|"]
  for r in rows:
    lines.append(
        f"| {r['name']} | {r['measured_seconds']:.4f} | {r['predicted_seconds']:.4f} "
        f"| {r['error']:+.1%} | {r['roofline_seconds']:.4f} | {r['matmul_seconds'] * 1e3:.1f} / "
        f"{r['memory_seconds'] * 1e3:.1f} / {r['kernel_seconds'] * 1e3:.1f} "
        f"| {r['kernels']:,.0f} | {r['hbm_bytes'] / 1e9:.1f} |")
  return "\n".join(lines) + "\n"


def check(steps: Sequence[MeasuredStep], commit: str | None, repository: Path, script: Path, *,
          hlo_dir: Path | None = None, triton_gemm: bool = False, tolerance: float = 0.10,
          model: roofline.GpuStepModel = roofline.FROZEN_GPU_MODEL) -> dict[str, Any]:
  """``model``'s predictions for ``steps`` compiled under ``commit`` of ``repository``
  (None: each step's own ``commit``), each against its measured seconds; ``ok`` when every
  one is within ``tolerance``. The programs are kept in ``hlo_dir`` (``NAME.hlo.txt.gz``)
  when given; ``triton_gemm`` leaves XLA's deviceless default (Triton for every matmul)."""
  options = {} if triton_gemm else dict(targets.GPU_COMPILER_OPTIONS)
  rows, memory, sites = [], {}, {}
  with tempfile.TemporaryDirectory(prefix="gpu_model_check-") as work:
    hlo_dir = Path(hlo_dir or work)
    hlo_dir.mkdir(parents=True, exist_ok=True)
    for step in steps:
      code = commit or step.commit
      if code not in sites:
        sites[code] = install_commit(code, repository, Path(work) / code)
      path = hlo_dir / f"{step.name}.hlo.txt.gz"
      memory[step.name] = compile_step(step, sites[code], path, options, script)
      rows.append(predict(step, gzip.decompress(path.read_bytes()).decode(), model))
      print(f"{step.name}: predicted {rows[-1]['predicted_seconds']:.4f} s, measured "
            f"{step.seconds:.4f} s ({rows[-1]['error']:+.1%})", flush=True)
  return {"commit": commit or sorted(sites), "compiler_options": options,
          "model": dataclasses.asdict(model), "tolerance": tolerance,
          "steps": rows, "memory": memory,
          "ok": all(abs(r["error"]) <= tolerance for r in rows)}
