"""Compile targets: TPU topologies, NVIDIA GPUs (compile-only devices) and simulated CPU meshes.

Names: ``GENERATION:TOPOLOGY`` for a TPU slice (``v2:16x16``, ``v4:8x8x8``), ``h100:N`` or
``h200:N`` for GPUs of one NVLink node (N up to 8), ``cpu:N``. TPU targets need libtpu,
GPU targets the ``gpu-aot`` extra; on the ``cpu`` platform a TPU or GPU name stands for a
CPU mesh of as many devices, its fit estimated against that device's usable memory.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  import jax

GIB = 1 << 30

# generation -> (devices per chip, usable HBM per device in GiB, chip config name). Usable:
# what libtpu 0.0.42.1 reports as available when a program does not fit (probe_usable_hbm).
GENERATIONS: dict[str, tuple[int, float, str | None]] = {
    "v2": (2, 7.48, None),
    "v3": (2, 15.48, None),
    "v4": (1, 30.75, "megacore"),
    "v5e": (1, 15.75, None),
    "v5p": (1, 95.74, None),
}
PLATFORMS = ("tpu", "gpu", "cpu")
_NAME = re.compile(r"^(v2|v3|v4|v5e|v5p):(\d+(?:x\d+){1,2})$")

# GPU generation -> its GpuTargetConfig (protobuf text, beside this module): the device
# as JAX's CUDA plugin describes it (H100 SXM 80 GB, H200 141 GB; the texts say more).
GPUS = {"h100": "h100.txtpb", "h200": "h200.txtpb"}
GPU_TARGET_CONFIGS = Path(__file__).parent / "gpu_targets"
# The share of a GPU's memory JAX may take: XLA_PYTHON_CLIENT_MEM_FRACTION in the command
# that runs on a GPU (tools/gpu_check.py); JAX's default is 0.75.
GPU_MEMORY_FRACTION = 0.94
# GPUs of one node, all connected by NVLink through NVSwitch.
MAX_GPUS = 8
# Deviceless compiles cannot autotune, and XLA then hands every matmul to Triton; the
# programs measured on the H200 (autotuned) called cuBLAS for most of them. cuBLAS for
# all of them reproduces those programs' HBM bytes and the frozen step-time model's check
# more closely (docs/performance.md, "GPU: targets, the frozen step-time model and the check").
GPU_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}
_GPU_NAME = re.compile(rf"^({'|'.join(GPUS)}):(\d+)$")


@dataclasses.dataclass(frozen=True)
class Target:
  """Where to compile.

  Attributes:
    name: ``v2:16x16``-style TPU topology name, ``h200:1``-style GPU name, or ``cpu:N``.
    platform: ``tpu`` or ``gpu`` (compile-only devices) or ``cpu`` (simulated devices).
    num_devices: devices (TPU cores; chips for v4/v5p megacore and v5e; GPUs).
    generation: TPU generation or GPU of the name (``roofline.HARDWARE``'s key), or
      None for ``cpu:N``.
    usable_hbm_bytes: memory per device to fit in (the TPU's or GPU's), or None.
  """

  name: str
  platform: str
  num_devices: int
  generation: str | None
  usable_hbm_bytes: int | None

  def __post_init__(self):
    if self.platform not in PLATFORMS:
      raise ValueError(f"Target {self.name!r}: platform={self.platform!r} must be one of "
                       f"{PLATFORMS}")
    if self.num_devices < 1:
      raise ValueError(f"Target {self.name!r}: num_devices={self.num_devices} must be >= 1")

  @property
  def compiler_options(self) -> dict[str, Any]:
    """XLA options for compiling for this target."""
    if self.platform == "cpu":  # simulated meshes are compiled, never run
      return {"xla_llvm_disable_expensive_passes": True}
    return dict(GPU_COMPILER_OPTIONS) if self.platform == "gpu" else {}

  @property
  def label(self) -> str:
    """The name, with the platform when the mesh is simulated."""
    if self.platform == "cpu" and self.generation is not None:
      return f"{self.name} (cpu)"
    return self.name

  def devices(self) -> list[jax.Device]:
    """The devices to build the mesh from.

    Raises:
      ValueError: libtpu or the CUDA plugin is missing for a TPU or GPU target, or JAX
        has too few CPU devices.
    """
    if self.platform == "tpu":
      return tpu_devices(self.name)
    if self.platform == "gpu":
      return gpu_devices(self.name)
    import jax  # not at import time: the device count must be set before JAX starts
    available = jax.devices("cpu")
    if len(available) < self.num_devices:
      raise ValueError(f"target {self.label} needs {self.num_devices} CPU devices but JAX has "
                       f"{len(available)}; set XLA_FLAGS=--xla_force_host_platform_device_count="
                       f"{self.num_devices} (or call simulate_cpu_devices) before JAX starts")
    return available[:self.num_devices]


def parse_target(name: str, platform: str | None = None) -> Target:
  """A ``Target`` from a TPU topology name (``v2:2x2``), a GPU name (``h200:1``) or ``cpu:N``.

  ``platform`` None compiles for the name's own devices; ``cpu`` simulates them.

  >>> parse_target('v2:16x16').num_devices, parse_target('v4:8x8x8').num_devices
  (512, 512)
  >>> t = parse_target('v2:2x2', 'cpu'); (t.num_devices, round(t.usable_hbm_bytes / 2**30, 2))
  (8, 7.48)
  >>> t = parse_target('h200:1'); (t.platform, t.generation, round(t.usable_hbm_bytes / 2**30, 1))
  ('gpu', 'h200', 132.0)
  """
  name = name.strip()
  if platform is not None and platform not in PLATFORMS:
    raise ValueError(f"target {name!r}: platform={platform!r} must be one of {PLATFORMS}")
  if name.startswith("cpu:"):
    count = name[4:]
    if not count.isdigit() or int(count) < 1:
      raise ValueError(f"target {name!r}: cpu:N needs a positive device count N")
    return Target(name, "cpu", int(count), None, None)
  gpu = _GPU_NAME.match(name)
  if gpu:
    generation, count = gpu.group(1), int(gpu.group(2))
    if not 1 <= count <= MAX_GPUS:
      raise ValueError(f"target {name!r}: {generation}:N takes 1 to {MAX_GPUS} GPUs (one "
                       "NVLink node)")
    if platform not in (None, "gpu", "cpu"):
      raise ValueError(f"target {name!r} is a GPU: platform={platform!r} must be gpu or cpu")
    usable = int(gpu_memory_bytes(generation) * GPU_MEMORY_FRACTION)
    return Target(name, platform or "gpu", count, generation, usable)
  match = _NAME.match(name)
  if not match:
    raise ValueError(f"target {name!r} is not a TPU topology name like v2:16x16, v4:8x8x8, "
                     f"v5e:16x16, v5p:4x8x8 ({', '.join(GENERATIONS)}), a GPU name like "
                     f"h100:1 or h200:8 ({', '.join(GPUS)}), nor cpu:N")
  if platform not in (None, "tpu", "cpu"):
    raise ValueError(f"target {name!r} is a TPU topology: platform={platform!r} must be tpu "
                     "or cpu")
  generation, topology = match.groups()
  per_chip, usable_gib, _ = GENERATIONS[generation]
  chips = math.prod(int(d) for d in topology.split("x"))
  return Target(name, platform or "tpu", chips * per_chip, generation, int(usable_gib * GIB))


def parse_gpu_target(name: str) -> Target:
  """``parse_target`` of a name that must be a GPU's (``h100:N``, ``h200:N``)."""
  target = parse_target(name)
  if target.platform != "gpu":
    raise ValueError(f"target {name!r}: name a GPU (h100:N, h200:N)")
  return target


def parse_targets(names: str | Sequence[str], platform: str | None = None) -> list[Target]:
  """Targets from a comma-separated list of names."""
  if isinstance(names, str):
    names = [n for n in names.split(",") if n.strip()]
  if not names:
    raise ValueError("no targets given: name TPU topologies (v2:2x2,...), GPUs (h200:1,...) "
                     "or cpu:N")
  return [parse_target(n, platform) for n in names]


def libtpu_available() -> bool:
  """Whether TPU topologies can be compiled for (the ``tpu`` extra is installed)."""
  return importlib.util.find_spec("libtpu") is not None


def prepare_libtpu() -> None:
  """Lets libtpu load on a machine without TPUs next to other processes that loaded it.

  Must run before JAX initializes. Only compile-only devices are used, so the
  lock that guards a real TPU between processes is not needed.
  """
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def tpu_devices(name: str) -> list[jax.Device]:
  """Compile-only devices of a TPU topology (libtpu needed, no TPU).

  Raises:
    ValueError: libtpu is not installed, or the topology is not known to it.
  """
  if not libtpu_available():
    raise ValueError(f"target {name!r} needs libtpu (pip install -e '.[tpu]'); on a machine "
                     "without it use --target=cpu")
  from jax.experimental import topologies
  generation = name.split(":")[0]
  chip_config = GENERATIONS.get(generation, (None, None, None))[2]
  kwargs = {"chip_config_name": chip_config} if chip_config else {}
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name,
                                             **kwargs).devices)
  except Exception as error:  # libtpu raises several kinds for unknown names
    raise ValueError(f"TPU topology {name!r} is not available: {error}") from error


def probe_usable_hbm(name: str) -> float | None:
  """The HBM per device the TPU compiler says is available, in GiB (compiles one too-big array)."""
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  devices = tpu_devices(name)
  mesh = Mesh(np.asarray(devices, dtype=object).reshape(-1), ("d",))
  size = len(devices) * (256 * GIB // 4)
  program = jax.jit(lambda: jax.numpy.ones((size,), jax.numpy.float32),
                    out_shardings=NamedSharding(mesh, PartitionSpec("d")))
  try:
    program.lower().compile()
  except Exception as error:  # the compiler's RESOURCE_EXHAUSTED
    match = re.search(r"available HBM \(([\d.]+)G\)", str(error))
    return float(match.group(1)) if match else None
  return None


def gpu_aot_available() -> bool:
  """Whether GPUs can be compiled for (JAX's CUDA plugin: the ``gpu-aot`` extra)."""
  return importlib.util.find_spec("jax_cuda12_plugin") is not None


@functools.cache
def gpu_target_config(generation: str) -> str:
  """The ``GpuTargetConfig`` text of a GPU generation (``h100``, ``h200``)."""
  if generation not in GPUS:
    raise ValueError(f"GPU {generation!r} is not one of {', '.join(GPUS)}")
  return (GPU_TARGET_CONFIGS / GPUS[generation]).read_text()


def gpu_memory_bytes(generation: str) -> int:
  """The device memory a GPU reports (its target config's ``device_memory_size``)."""
  return int(re.search(r"device_memory_size: (\d+)", gpu_target_config(generation)).group(1))


def gpu_devices(name: str) -> list[jax.Device]:
  """Compile-only devices of ``h100:N`` / ``h200:N`` (JAX's CUDA plugin needed, no GPU).

  Raises:
    ValueError: the plugin is not installed, or JAX cannot make the topology.
  """
  if not gpu_aot_available():
    raise ValueError(f"target {name!r} needs JAX's CUDA plugin (the gpu-aot extra, in a venv "
                     "of its own: make test-gpu-aot); on a machine without it use --target=cpu")
  from jax.experimental import topologies
  generation, count = name.split(":")
  try:
    return list(topologies.get_topology_desc(
        platform="cuda", target_config=gpu_target_config(generation),
        topology=f"1x1x{int(count)}").devices)
  except Exception as error:  # the plugin raises several kinds
    raise ValueError(f"GPU topology {name!r} is not available: {error}") from error
