"""The device mesh: a ``(data, model)`` grid of devices.

``data`` splits the batch (and with 2-D parameter rules the weights' ``embed``), ``model``
the heads, mlp and vocab dimensions. Sizes are T5X's ``num_partitions`` (the model-parallel
size) or ``data`` / ``model`` sizes, ``-1`` filling from the device count (MaxText).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)  # one place: a multi-slice `replica` axis can go first


def _check_size(name: str, size: object) -> None:
  if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
    raise ValueError(f"mesh {name}={size!r} is a {type(size).__name__}; expected an int: a "
                     "positive size, or -1 to fill from the device count")


def _simulation_hint(count: int) -> str:
  return (f"; on CPU, simulate {count} devices: --num_cpu_devices={count} on a meshbayes "
          f"command line, or XLA_FLAGS=--xla_force_host_platform_device_count={count} set "
          "before jax is imported")


def resolve_axis_sizes(num_devices: int, sizes: Mapping[str, int], *, on_cpu: bool = False
                       ) -> dict[str, int]:
  """Fills at most one ``-1`` size so that the sizes multiply to ``num_devices``.

  Args:
    num_devices: number of devices the mesh must use.
    sizes: mesh axis name -> size (positive, or -1 for "the rest").
    on_cpu: the devices are CPU devices: a mesh larger than them says how to
      simulate more.

  Returns:
    Axis name -> resolved size, in the given order.

  Raises:
    ValueError: the sizes are invalid or do not multiply to ``num_devices``.

  >>> resolve_axis_sizes(8, {'data': -1, 'model': 2})
  {'data': 4, 'model': 2}
  """
  for name, size in sizes.items():
    _check_size(name, size)
  described = " x ".join(f"{name}={size}" for name, size in sizes.items())
  free = [name for name, size in sizes.items() if size == -1]
  if len(free) > 1 or any(size < 1 and size != -1 for size in sizes.values()):
    raise ValueError(f"mesh {described}: each axis size must be a positive int, and at most "
                     "one may be -1 (fill from the device count)")
  fixed = math.prod(size for size in sizes.values() if size != -1)
  hint = _simulation_hint(fixed) if on_cpu and fixed > num_devices else ""
  if free:
    if num_devices % fixed:
      raise ValueError(f"mesh {described}: {num_devices} devices do not divide by {fixed}; "
                       f"choose sizes whose product divides {num_devices}{hint}")
    sizes = {name: num_devices // fixed if size == -1 else size for name, size in sizes.items()}
  elif fixed != num_devices:
    raise ValueError(f"mesh {described} needs {fixed} devices but {num_devices} are available"
                     + (hint or "; choose sizes that multiply to the device count, or use -1 "
                                "for one of them"))
  return dict(sizes)


def simulate_cpu_devices(count: int) -> None:
  """Makes JAX's CPU backend present ``count`` devices (for meshes on a CPU machine).

  Must run before JAX initializes its backends; afterwards it only checks
  that at least ``count`` devices exist (e.g. set by ``XLA_FLAGS`` in tests).

  Raises:
    ValueError: the backend is up with fewer devices.
  """
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:
    pass
  if jax.device_count() < count:
    raise ValueError(f"{count} devices are needed but JAX already started with "
                     f"{jax.device_count()}; call simulate_cpu_devices({count}) before any JAX "
                     "operation, or set XLA_FLAGS=--xla_force_host_platform_device_count="
                     f"{count}")


def _device_grid(devices: Sequence[jax.Device], shape: tuple[int, ...]) -> np.ndarray:
  # On TPUs mesh_utils orders devices along the interconnect; it rejects some
  # topologies (v4 without megacore, some multi-slice shapes), where a plain
  # reshape of the device list is correct, if less tuned.
  if devices[0].platform == "tpu":
    try:
      return mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError, AssertionError):
      pass
  return np.asarray(devices, dtype=object).reshape(shape)


def create_mesh(devices: Sequence[jax.Device] | None = None, *, num_partitions: int | None = None,
                data: int = -1, model: int = 1) -> Mesh:
  """A ``(data, model)`` mesh over ``devices`` (default: ``jax.devices()``).

  Args:
    devices: the devices: CPU (simulated), GPU or TPU devices, or the
      compile-only devices of ``jax.experimental.topologies``.
    num_partitions: model-parallel size (T5X's name); the data axis takes the
      rest. Give either this or ``data``/``model``.
    data: data-parallel size, or -1 to fill from the device count.
    model: model-parallel size, or -1 to fill from the device count.

  Returns:
    The mesh, axes ``('data', 'model')``.

  Raises:
    ValueError: the sizes do not match the devices.

  >>> import jax
  >>> dict(create_mesh(jax.devices()[:1]).shape)
  {'data': 1, 'model': 1}
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_partitions is not None:
    _check_size("num_partitions", num_partitions)
    if (data, model) != (-1, 1):
      raise ValueError(f"create_mesh: give num_partitions={num_partitions} or data={data}/"
                       f"model={model}, not both")
    data, model = -1, num_partitions
  sizes = resolve_axis_sizes(len(devices), {DATA_AXIS: data, MODEL_AXIS: model},
                             on_cpu=bool(devices) and devices[0].platform == "cpu")
  shape = tuple(sizes[name] for name in MESH_AXES)
  return Mesh(_device_grid(devices, shape), MESH_AXES)
