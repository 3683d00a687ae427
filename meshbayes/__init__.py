"""meshbayes: giant Bayesian neural networks with model parallelism, on JAX and Flax."""

__version__ = "0.1.0"
