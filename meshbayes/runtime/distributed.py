"""Multi-host runs: many processes, one mesh, through JAX's multi-controller runtime.

``initialize(DistributedOptions)`` decides whether and how to call
``jax.distributed.initialize`` (explicit coordinator, process count and index,
or JAX's cluster auto-detection); it must run before anything touches a device.
Usage, and what happens when a process is lost: docs/multihost.md.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import sys

from meshbayes.field_checks import positive_ints

_LOOPBACK_NAMES = ("localhost",)
_LOG = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
  host = host.strip("[]")
  if host in _LOOPBACK_NAMES:
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
  """How this process joins a multi-process run (nothing set: a single process).

  Attributes:
    coordinator_address: ``host:port`` of process 0's coordination service.
    num_processes: number of processes in the run.
    process_id: this process's index, ``0 <= process_id < num_processes``.
    auto: initialize even without the above, letting JAX detect the cluster
      (TPU pods, SLURM, Open MPI, Kubernetes) and fill in what is missing.
    num_cpu_devices: CPU devices this process presents (``jax_num_cpu_devices``;
      for local runs and tests on a machine without accelerators).
    heartbeat_timeout_seconds: a process silent this long is declared dead
      and the others stop with an error.
    initialization_timeout_seconds: how long to wait for every process to
      connect before giving up.
    shutdown_timeout_seconds: how long a finishing process waits for the
      others at exit.
  """

  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  auto: bool = False
  num_cpu_devices: int | None = None
  heartbeat_timeout_seconds: int = 100
  initialization_timeout_seconds: int = 300
  shutdown_timeout_seconds: int = 60

  def __post_init__(self):
    positive_ints("distributed", self, "num_processes", "num_cpu_devices",
                  "heartbeat_timeout_seconds", "initialization_timeout_seconds",
                  "shutdown_timeout_seconds", allow_none=True)
    positive_ints("distributed", self, "process_id", allow_zero=True, allow_none=True)
    if (self.num_processes is not None and self.process_id is not None
        and self.process_id >= self.num_processes):
      raise ValueError(f"distributed: process_id={self.process_id} must be less than "
                       f"num_processes={self.num_processes}")
    if self.coordinator_address is not None and ":" not in self.coordinator_address:
      raise ValueError(f"distributed: coordinator_address={self.coordinator_address!r} must "
                       "be host:port")
    if self.explicit and not self.auto and None in (self.coordinator_address,
                                                     self.num_processes, self.process_id):
      raise ValueError("distributed: give coordinator_address, num_processes and process_id "
                       "together (or --multihost to let JAX detect the cluster)")

  @property
  def explicit(self) -> bool:
    return any(v is not None for v in (self.coordinator_address, self.num_processes,
                                       self.process_id))

  @property
  def enabled(self) -> bool:
    """Whether ``jax.distributed`` is to be initialized."""
    return self.auto or self.explicit


def initialize(options: DistributedOptions) -> None:
  """Configures this process's devices and joins the run; call before any device use.

  A single process (no option set) is left exactly as it was. A loopback
  coordinator binds to loopback only, so local runs never listen on the network.

  Raises:
    RuntimeError: JAX's backends are already up, or the run could not be
      joined within ``initialization_timeout_seconds``.
  """
  import jax  # here, not at the top: the command lines check their flags before it loads

  if options.num_cpu_devices is not None:
    jax.config.update("jax_num_cpu_devices", options.num_cpu_devices)
  if not options.enabled:
    return
  bind = None
  if options.coordinator_address is not None:
    host = options.coordinator_address.rsplit(":", 1)[0]
    if _is_loopback(host):
      bind = options.coordinator_address
  jax.distributed.initialize(
      coordinator_address=options.coordinator_address, num_processes=options.num_processes,
      process_id=options.process_id, coordinator_bind_address=bind,
      initialization_timeout=options.initialization_timeout_seconds,
      heartbeat_timeout_seconds=options.heartbeat_timeout_seconds,
      shutdown_timeout_seconds=options.shutdown_timeout_seconds)
  _LOG.info("joined a run of %d processes as process %d (%d local devices of %d)",
               jax.process_count(), jax.process_index(), jax.local_device_count(),
               jax.device_count())


def process_label() -> str:
  """``'process i/n: '`` in a multi-process run, else ``''`` (for error lines)."""
  jax = sys.modules.get("jax")  # a process that has not imported jax has joined no run
  if jax is None or not jax.distributed.is_initialized():
    return ""
  return f"process {jax.process_index()}/{jax.process_count()}: "
