"""meshbayes: giant Bayesian neural networks with model parallelism, on JAX and Flax."""

from meshbayes.runtime import old_paths as _old_paths

__version__ = "0.1.0"

_old_paths.install()
