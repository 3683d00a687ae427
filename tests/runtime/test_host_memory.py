"""malloc settings that keep the CPU runtime's per-step buffers (``meshbayes.runtime.host_memory``)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from meshbayes.runtime import host_memory

GLIBC = ("glibc", "2.36")
HUGE = "glibc.malloc.hugetlb=1"
REUSING = {"MESHBAYES_MALLOC": "reuse"}
REUSE = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"


@pytest.mark.parametrize("environ, mode, libc, expected", [
    ({}, "madvise", GLIBC, HUGE),
    ({}, "always", GLIBC, None),  # huge pages without asking
    ({}, "never", GLIBC, None),
    ({}, None, GLIBC, None),
    (REUSING, "madvise", GLIBC, f"{REUSE}:{HUGE}"),
    (REUSING, "always", GLIBC, f"{REUSE}:glibc.malloc.hugetlb=0"),
    ({**REUSING, "GLIBC_TUNABLES": "glibc.malloc.arena_max=4:glibc.rtld.x=2"}, "madvise", GLIBC,
     "glibc.malloc.arena_max=4:glibc.rtld.x=2:glibc.malloc.mmap_max=0:"
     f"glibc.malloc.trim_threshold=1099511627776:{HUGE}"),  # the user's tunables kept
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC, None),  # executed again
    ({"MESHBAYES_MALLOC": "default"}, "madvise", GLIBC, None),
    ({}, "madvise", ("glibc", "2.34"), None),
    ({}, "madvise", ("glibc", "2.35"), HUGE),
    ({}, "madvise", ("", ""), None),  # musl, macOS
])
def test_tunables_are_added_only_where_they_change_something(environ, mode, libc, expected):
  assert host_memory.malloc_tunables(environ, mode, libc) == expected


def test_an_unknown_setting_is_one_line_naming_the_valid_ones():
  with pytest.raises(ValueError, match=r"^MESHBAYES_MALLOC='huge' must be one of huge_pages, "
                                       r"reuse, default$"):
    host_memory.malloc_tunables({"MESHBAYES_MALLOC": "huge"}, "madvise", GLIBC)


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert host_memory.transparent_huge_page_mode(path) == "madvise"
  assert host_memory.transparent_huge_page_mode(tmp_path / "missing") is None


_PROGRAM = """
import json, os, resource
from meshbayes.runtime import host_memory
pid = os.getpid()
host_memory.exec_with_malloc_tunables()
import jax, jax.numpy as jnp
def huge_page_fallbacks():  # the kernel's count (all processes) of huge-page faults it refused
  with open("/proc/vmstat") as f:
    counters = dict(line.split() for line in f)
  return int(counters.get("thp_fault_fallback", 0))
step = jax.jit(lambda a, b: (a @ b).max())  # the product: a 256 MiB temporary per call
a, b = jnp.ones((8192, 8), jnp.float32), jnp.ones((8, 8192), jnp.float32)
step(a, b).block_until_ready()
faults, fallbacks = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, huge_page_fallbacks()
for _ in range(3):
  step(a, b).block_until_ready()
print(json.dumps({"pid": pid, "now": os.getpid(), "malloc": host_memory.malloc_settings(),
                  "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 3,
                  "fallbacks": (huge_page_fallbacks() - fallbacks) / 3}))
"""


def _run(environ):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **environ}
  env.pop("GLIBC_TUNABLES", None)
  out = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, check=True,
                       capture_output=True, text=True).stdout
  return json.loads(out.splitlines()[-1])


@pytest.mark.integration
@pytest.mark.skipif(host_memory.transparent_huge_page_mode() != "madvise"
                    or host_memory.malloc_tunables({}, "madvise", platform.libc_ver()) is None,
                    reason="needs glibc 2.35 or later and transparent huge pages on madvise")
def test_programs_executed_again_fault_their_buffers_in_huge_pages_or_reuse_them():
  default, huge, reuse = (_run({"MESHBAYES_MALLOC": setting})
                          for setting in ("default", "huge_pages", "reuse"))
  assert huge["pid"] == huge["now"]  # the same process, executed again
  assert default["malloc"] == {} and huge["malloc"] == {"glibc.malloc.hugetlb": "1"}
  # A 256 MiB buffer mapped afresh at every call: 65,536 faults of 4 KiB pages, 128 of
  # 2 MiB; none where the heap keeps it. Each 2 MiB the kernel could not back with a huge
  # page (no free one on a loaded machine) faults in 512 small pages instead.
  assert default["faults"] > 30_000, default
  assert huge["faults"] < default["faults"] / 8 + 512 * huge["fallbacks"], (huge, default)
  assert reuse["faults"] < 100, reuse


@pytest.mark.integration
def test_a_program_given_an_unknown_setting_stops_with_one_line():
  env = {**os.environ, "MESHBAYES_MALLOC": "huge"}
  run = subprocess.run([sys.executable, "-m", "meshbayes.train"], env=env,
                       capture_output=True, text=True)
  assert run.returncode == 1
  assert run.stderr.strip().splitlines() == [
      "meshbayes.train: error: MESHBAYES_MALLOC='huge' must be one of huge_pages, reuse, default"]
