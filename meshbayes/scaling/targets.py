"""Compile targets: TPU topologies (compile-only devices, no TPU needed) and simulated CPU meshes.

A target is named like a TPU slice, ``GENERATION:TOPOLOGY`` (``v2:16x16``,
``v4:8x8x8``, ``v5e:16x16``, ``v5p:4x8x8``), or ``cpu:N``. On the ``tpu``
platform the name gives ``jax.experimental.topologies`` devices (libtpu
needed; v4 and v5p as megacore chips, one device per chip). On the ``cpu``
platform a TPU name stands for a simulated CPU mesh with as many devices as
the slice has, and fitting is estimated against that TPU's memory.

Usable HBM per device is what the TPU compiler reports as available when a
program does not fit (libtpu 0.0.42.1; ``probe_usable_hbm`` measures it):
TPUv2 7.48 GiB of its 8, v3 15.48 of 16, v4 30.75 of 32, v5e 15.75 of 16,
v5p 95.74 of 95.74.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  import jax

GIB = 1 << 30

# generation -> (devices per chip, usable HBM per device in GiB, chip config name)
GENERATIONS: dict[str, tuple[int, float, str | None]] = {
    "v2": (2, 7.48, None),
    "v3": (2, 15.48, None),
    "v4": (1, 30.75, "megacore"),
    "v5e": (1, 15.75, None),
    "v5p": (1, 95.74, None),
}
PLATFORMS = ("tpu", "cpu")
_NAME = re.compile(r"^(v2|v3|v4|v5e|v5p):(\d+(?:x\d+){1,2})$")


@dataclasses.dataclass(frozen=True)
class Target:
  """Where to compile.

  Attributes:
    name: ``v2:16x16``-style TPU topology name, or ``cpu:N``.
    platform: ``tpu`` (compile-only TPU devices) or ``cpu`` (simulated devices).
    num_devices: devices (TPU cores; chips for v4/v5p megacore and v5e).
    generation: TPU generation of the name, or None for ``cpu:N``.
    usable_hbm_bytes: memory per device to fit in (the TPU's), or None.
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
  def label(self) -> str:
    """The name, with the platform when the mesh is simulated."""
    if self.platform == "cpu" and self.generation is not None:
      return f"{self.name} (cpu)"
    return self.name

  def devices(self) -> list[jax.Device]:
    """The devices to build the mesh from.

    Raises:
      ValueError: libtpu is missing for a TPU target, or JAX has too few CPU devices.
    """
    if self.platform == "tpu":
      return tpu_devices(self.name)
    import jax  # not at import time: the device count must be set before JAX starts
    available = jax.devices("cpu")
    if len(available) < self.num_devices:
      raise ValueError(f"target {self.label} needs {self.num_devices} CPU devices but JAX has "
                       f"{len(available)}; set XLA_FLAGS=--xla_force_host_platform_device_count="
                       f"{self.num_devices} (or call simulate_cpu_devices) before JAX starts")
    return available[:self.num_devices]


def parse_target(name: str, platform: str = "tpu") -> Target:
  """A ``Target`` from a topology name (``v2:2x2``) or ``cpu:N``.

  >>> parse_target('v2:16x16').num_devices, parse_target('v4:8x8x8').num_devices
  (512, 512)
  >>> t = parse_target('v2:2x2', 'cpu'); (t.num_devices, round(t.usable_hbm_bytes / 2**30, 2))
  (8, 7.48)
  """
  name = name.strip()
  if name.startswith("cpu:"):
    count = name[4:]
    if not count.isdigit() or int(count) < 1:
      raise ValueError(f"target {name!r}: cpu:N needs a positive device count N")
    return Target(name, "cpu", int(count), None, None)
  match = _NAME.match(name)
  if not match:
    raise ValueError(f"target {name!r} is not a TPU topology name like v2:16x16, v4:8x8x8, "
                     f"v5e:16x16, v5p:4x8x8 ({', '.join(GENERATIONS)}), nor cpu:N")
  generation, topology = match.groups()
  per_chip, usable_gib, _ = GENERATIONS[generation]
  chips = math.prod(int(d) for d in topology.split("x"))
  return Target(name, platform, chips * per_chip, generation, int(usable_gib * GIB))


def parse_targets(names: str | Sequence[str], platform: str = "tpu") -> list[Target]:
  """Targets from a comma-separated list of names."""
  if isinstance(names, str):
    names = [n for n in names.split(",") if n.strip()]
  if not names:
    raise ValueError("no targets given: name TPU topologies (v2:2x2,...) or cpu:N")
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
