"""Per-step tables of GPU train steps by both frozen models, from deviceless programs.

``compile_programs`` compiles the trainer's step (``step_spec``: AdamW, bf16, no remat,
``data_only``) of each ``TableStep`` for each GPU target without a GPU and keeps each
program (``NAME.hlo.txt.gz``) beside its record (``NAME.json``: XLA's memory analysis,
the traced FLOPs); ``rows`` reads such a folder into one row per program: seconds by
``roofline.FROZEN_GPU_MODEL`` (v1) and ``FROZEN_GPU_MODEL_V2``, MFU by each, kernels,
HBM bytes and fused-attention calls per step; ``markdown`` prints them. Compiling needs
JAX's CUDA plugin (the gpu-aot venv); reading a folder does not.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from meshbayes.layers.dense import GROUPED
from meshbayes.models.transformer.config import GROUPED_COMPONENTS
from meshbayes.runtime import strict_json
from meshbayes.scaling import fused_attention, roofline

# gin_configs/hardware/gpu.gin's shape, with the attention kernel chosen per step.
GPU_SHAPE = (("scan_layers", False), ("attention_dropout_rate", 0.0))


@dataclasses.dataclass(frozen=True)
class TableStep:
  """One step of a table: preset, deterministic or Bayesian, sequences per device, length,
  the attention kernel (``cudnn``: gpu.gin's; ``xla``: the alternative), and
  ``weight_groups_per_device``: 0 for the model's own estimators, else the grouped
  reparameterization in every component that takes it, with that many weight samples per
  device (1: one per data-parallel shard)."""

  preset: str
  deterministic: bool
  batch_per_device: int
  length: int = 256
  attention: str = "cudnn"
  weight_groups_per_device: int = 0

  def __post_init__(self):
    if self.weight_groups_per_device < 0 or (self.weight_groups_per_device
                                             and self.deterministic):
      raise ValueError(f"TableStep: weight_groups_per_device={self.weight_groups_per_device} "
                       "must be 0, or at least 1 for a Bayesian step")

  @property
  def label(self) -> str:
    """The step without its target and shape: ``paper_bayes_g8_cudnn``."""
    kind = "det" if self.deterministic else "bayes"
    groups = f"_g{self.weight_groups_per_device}" if self.weight_groups_per_device else ""
    return f"{self.preset}_{kind}{groups}_{self.attention}"

  def name(self, target: str) -> str:
    return f"{self.label}_{target.replace(':', '-')}_{self.batch_per_device}x{self.length}"

  def spec(self, num_devices: int) -> Any:
    """The trainer's step (``step_spec.StepSpec``) over ``num_devices`` data-parallel GPUs."""
    from meshbayes.scaling.step_spec import step_spec

    overrides = GPU_SHAPE + (("attention_kernel", self.attention),)
    if self.weight_groups_per_device:
      overrides += (("num_weight_groups", self.weight_groups_per_device * num_devices),)
    spec = step_spec(self.preset, self.batch_per_device * num_devices, self.length,
                     self.deterministic, dtype="bfloat16", remat_policy="none",
                     overrides=overrides)
    if self.weight_groups_per_device:
      spec = spec.replace(estimators=tuple((c, GROUPED) for c in GROUPED_COMPONENTS))
    return spec


# gpu.gin's sequences per GPU: base 128; paper 32 deterministic, 16 Bayesian.
GPU_GIN_STEPS = (TableStep("base", True, 128), TableStep("base", False, 128),
                 TableStep("paper", True, 32), TableStep("paper", False, 16))


def compile_programs(steps: Iterable[TableStep], target_names: Sequence[str], folder: Path
                     ) -> list[str]:
  """Compiles each step for each target (data parallel over its GPUs: the global batch is
  ``batch_per_device`` times their number) into ``folder``; a name already there is kept.
  Returns the names compiled or found."""
  from meshbayes.scaling import aot, targets

  folder.mkdir(parents=True, exist_ok=True)
  names = []
  for target_name in target_names:
    target = targets.parse_target(target_name)
    for step in steps:
      name = step.name(target_name)
      names.append(name)
      if (folder / f"{name}.json").is_file():
        continue
      record = aot.compile_step(step.spec(target.num_devices), target, keep_hlo=True)
      text = record.pop("hlo_text", None)
      if text is not None:
        (folder / f"{name}.hlo.txt.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
      record.update(name=name, per_device_batch=step.batch_per_device)
      (folder / f"{name}.json").write_text(strict_json.dumps(record, default=str))
  return names


def row(record: dict[str, Any], hlo_text: str) -> dict[str, Any]:
  """One program's figures by both frozen models."""
  mesh = record.get("mesh") or {"data": 1}
  program = fused_attention.program_record(
      hlo_text, record["generation"], batch_size=record["batch_size"],
      input_length=record["input_length"], target_length=record["target_length"],
      mesh_shape=mesh, model_flops_per_device=record["model_flops_per_device"])
  v1, v2 = (roofline.predict(program, gpu_model=model)
            for model in (roofline.FROZEN_GPU_MODEL, roofline.FROZEN_GPU_MODEL_V2))
  operations = program["operations_per_device"].values()
  # The name is TableStep.name's: label, target, shape, none of the last two with a '_'.
  return {"name": record["name"], "label": record["name"].rsplit("_", 2)[0],
          "target": record["target"],
          "per_device_batch": record["per_device_batch"], "length": record["input_length"],
          "v1_seconds": v1.step_seconds, "v2_seconds": v2.step_seconds, "v1_mfu": v1.mfu,
          "v2_mfu": v2.mfu, "v2_attention_seconds": v2.attention_seconds,
          "kernels": sum(op["executed"] for op in operations),
          "hbm_bytes": sum(op["bytes"] for op in operations),
          "fused_attention_calls": sum(c["executed"]
                                       for c in program["fused_attention_per_device"]),
          "peak_bytes": record.get("peak_bytes_per_device"), "fits": record.get("fits")}


def rows(folder: Path, names: Iterable[str]) -> list[dict[str, Any]]:
  """``row`` of each named program in ``folder`` that compiled (the others left out)."""
  found = []
  for name in names:
    path = folder / f"{name}.hlo.txt.gz"
    if path.is_file():
      record = json.loads((folder / f"{name}.json").read_text())
      found.append(row(record, gzip.decompress(path.read_bytes()).decode()))
  return found


def markdown(table: Sequence[dict[str, Any]]) -> str:
  """The rows as a markdown table."""
  lines = ["| step | target | shape | v1 s | v2 s | v1 MFU | v2 MFU | v2 attention ms "
           "| fused calls | kernels | HBM GB | peak GiB |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in table:
    peak = r["peak_bytes"] / 2**30 if r["peak_bytes"] else None
    lines.append(
        f"| {r['label']} | {r['target']} | {r['per_device_batch']} x "
        f"{r['length']} | {r['v1_seconds']:.4f} | {r['v2_seconds']:.4f} | {r['v1_mfu']:.1%} "
        f"| {r['v2_mfu']:.1%} | {r['v2_attention_seconds'] * 1e3:.1f} "
        f"| {r['fused_attention_calls']:.0f} | {r['kernels']:,.0f} "
        f"| {r['hbm_bytes'] / 1e9:.0f} | {'-' if peak is None else format(peak, '.1f')} |")
  return "\n".join(lines) + "\n"
