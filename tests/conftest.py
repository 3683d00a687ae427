"""Test set-up: 8 simulated CPU devices, set before anything imports jax.

Compiled programs are cached on disk for the session (a fresh directory each
run), so the many runs of the same tiny models, subprocesses included,
compile once.
"""

import os
import tempfile

# Backend optimization off: most tests run tiny programs a few times each, where LLVM's
# optimization passes take most of the time (the layer tests' CPU time halved, measured);
# results agree with optimized code to float rounding. A test with a long loop asks for
# optimized code (jax.jit's compiler_options); XLA_FLAGS with a level overrides this.
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_flags, "--xla_force_host_platform_device_count=8"]
    + ([] if "xla_backend_optimization_level" in _flags else ["--xla_backend_optimization_level=0"])
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TPU-topology tests compile only; libtpu's lock against sharing a real TPU between
# processes would make them fail while another process has libtpu loaded.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="meshbayes-jax-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
