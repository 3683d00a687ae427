"""malloc settings that keep the CPU runtime's per-step buffers (``meshbayes.host_memory``)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from meshbayes import host_memory

GLIBC = ("glibc", "2.36")
HUGE = "glibc.malloc.hugetlb=1"
REUSING = {"MESHBAYES_MALLOC": "reuse"}
REUSE = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"


@pytest.mark.parametrize("environ, mode, libc, cpu, expected", [
    ({}, "madvise", GLIBC, True, f"{REUSE}:{HUGE}"),  # auto: the CPU runs the model
    ({}, "madvise", GLIBC, False, HUGE),  # auto: a host feeding accelerators
    ({}, "always", GLIBC, True, f"{REUSE}:glibc.malloc.hugetlb=0"),  # huge without asking
    ({}, "always", GLIBC, False, None),
    ({}, "never", GLIBC, False, None),
    ({}, None, GLIBC, False, None),
    (REUSING, "madvise", GLIBC, False, f"{REUSE}:{HUGE}"),
    ({"MESHBAYES_MALLOC": "huge_pages"}, "madvise", GLIBC, True, HUGE),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4:glibc.rtld.x=2"}, "madvise", GLIBC, True,
     "glibc.malloc.arena_max=4:glibc.rtld.x=2:glibc.malloc.mmap_max=0:"
     f"glibc.malloc.trim_threshold=1099511627776:{HUGE}"),  # the user's tunables kept
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC, True, None),  # again
    ({"MESHBAYES_MALLOC": "default"}, "madvise", GLIBC, True, None),
    ({}, "madvise", ("glibc", "2.34"), True, None),
    ({}, "madvise", ("glibc", "2.35"), False, HUGE),
    ({}, "madvise", ("", ""), True, None),  # musl, macOS
])
def test_tunables_are_added_only_where_they_change_something(environ, mode, libc, cpu, expected):
  assert host_memory.malloc_tunables(environ, mode, libc, cpu) == expected


@pytest.mark.parametrize("platforms, devices, cpu", [
    ("cpu", ("/dev/null",), True), ("tpu,cpu", (), False), ("cuda", (), False),
    ("", ("/dev/null",), False), ("", ("/no/such/device",), True),
])
def test_the_cpu_runs_the_model_unless_an_accelerator_is_there_or_named(platforms, devices, cpu):
  assert host_memory.cpu_runs_the_model({"JAX_PLATFORMS": platforms}, devices) == cpu


def test_an_unknown_setting_is_one_line_naming_the_valid_ones():
  with pytest.raises(ValueError, match=r"^MESHBAYES_MALLOC='huge' must be one of auto, reuse, "
                                       r"huge_pages, default$"):
    host_memory.malloc_tunables({"MESHBAYES_MALLOC": "huge"}, "madvise", GLIBC, True)


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert host_memory.transparent_huge_page_mode(path) == "madvise"
  assert host_memory.transparent_huge_page_mode(tmp_path / "missing") is None


_PROGRAM = """
import json, os, resource
from meshbayes import host_memory
pid = os.getpid()
host_memory.exec_with_malloc_tunables()
import jax, jax.numpy as jnp
step = jax.jit(lambda a, b: (a @ b).max())  # the product: a 256 MiB temporary per call
a, b = jnp.ones((8192, 8), jnp.float32), jnp.ones((8, 8192), jnp.float32)
step(a, b).block_until_ready()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
  step(a, b).block_until_ready()
print(json.dumps({"pid": pid, "now": os.getpid(), "malloc": host_memory.malloc_settings(),
                  "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 3}))
"""


def _run(environ):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **environ}
  env.pop("GLIBC_TUNABLES", None)
  out = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, check=True,
                       capture_output=True, text=True).stdout
  return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(host_memory.transparent_huge_page_mode() != "madvise"
                    or host_memory.malloc_tunables({}, "madvise", platform.libc_ver(), True) is None,
                    reason="needs glibc 2.35 or later and transparent huge pages on madvise")
def test_programs_executed_again_fault_their_buffers_in_huge_pages_or_reuse_them():
  default, huge, reuse = (_run({"MESHBAYES_MALLOC": setting})
                          for setting in ("default", "huge_pages", "reuse"))
  assert huge["pid"] == huge["now"]  # the same process, executed again
  assert default["malloc"] == {} and huge["malloc"] == {"glibc.malloc.hugetlb": "1"}
  # A 256 MiB buffer mapped afresh at every call: 65,536 faults of 4 KiB pages, 128 of
  # 2 MiB; none where the heap keeps it.
  assert default["faults"] > 30_000, default
  assert huge["faults"] < 2_000, huge
  assert reuse["faults"] < 100, reuse


def test_a_program_given_an_unknown_setting_stops_with_one_line():
  env = {**os.environ, "MESHBAYES_MALLOC": "huge"}
  run = subprocess.run([sys.executable, "-m", "meshbayes.train"], env=env,
                       capture_output=True, text=True)
  assert run.returncode == 1
  assert run.stderr.strip().splitlines() == [
      "meshbayes.train: error: MESHBAYES_MALLOC='huge' must be one of auto, reuse, huge_pages, default"]
