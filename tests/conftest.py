"""Test set-up: 8 simulated CPU devices, set before anything imports jax.

Compiled programs are cached on disk for the session (a fresh directory each
run), so the many runs of the same tiny models, subprocesses included,
compile once.
"""

import os
import tempfile

# Compiling for speed of compiling: most tests run tiny programs a few times each, where
# compiling takes most of the time. Backend optimization off (LLVM's passes: the layer
# tests' CPU time halved, measured), XLA's older loop emitters instead of its fusion
# emitters and code generated in one piece (half the compile time again on the Bayesian
# layers' gradients, measured). Results agree with the defaults to float rounding. A test
# with a long loop asks for optimized code (jax.jit's compiler_options); XLA_FLAGS that
# name a setting override it.
_FAST_COMPILE = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false",
                 "xla_cpu_parallel_codegen_split_count": "1"}
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_flags, "--xla_force_host_platform_device_count=8"]
    + [f"--{name}={value}" for name, value in _FAST_COMPILE.items() if name not in _flags]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TPU-topology tests compile only; libtpu's lock against sharing a real TPU between
# processes would make them fail while another process has libtpu loaded.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="meshbayes-jax-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
