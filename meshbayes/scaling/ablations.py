"""Steps and layers with one kind of work taken out or swapped while they are traced.

For measurement only: each is a context manager (or a function returning one)
under which a program is traced and compiled; nothing is ever trained so. What
the difference costs is the timed difference (``tools/bench.py``,
``tools/step_profile.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp

from meshbayes.layers import estimators
from meshbayes.training import ivon, train_step

# IVON's step with one kind of its extra work taken out: its noise drawn as zeros; its
# posterior-stddev metrics.
IVON_ABLATIONS = {
    "ivon_without_noise": lambda: mock.patch.object(
        ivon.IVON, "noise", lambda config, state, index: jax.tree.map(jnp.zeros_like,
                                                                      state.hessian)),
    "ivon_without_stddev_metrics": lambda: mock.patch.object(
        train_step, "posterior_stddev_metrics", lambda stddevs: {}),
}


# The Bayesian step with its layers' estimators swapped: as written, keeping their noise
# for the backward pass (before issue 32); and regenerating but keeping the local
# reparameterization's variance.
_KEEP_VARIANCE = jax.checkpoint_policies.save_only_these_names(estimators.VARIANCE_NAME)
NOISE_ABLATIONS = {
    "bayesian_storing_noise": lambda: estimators.swapped(estimators.STORED),
    "bayesian_keeping_variance": lambda: estimators.swapped({
        table: {"local_reparameterization": estimators.regenerating(
            estimators.local_reparameterization, policy=_KEEP_VARIANCE)}
        for table in ("DENSE", "CONV")}),
}


@contextlib.contextmanager
def constant_noise() -> Iterator[None]:
  """The estimators draw constants instead of noise (same shapes, no hash, no inverse CDF)."""
  saved = estimators.standard_normal, estimators.rademacher
  estimators.standard_normal = lambda key, shape, dtype=jnp.float32: jnp.full(
      tuple(shape), 0.5, dtype)
  estimators.rademacher = lambda key, shape, dtype: jnp.full(tuple(shape), -1, dtype)
  try:
    yield
  finally:
    estimators.standard_normal, estimators.rademacher = saved


@contextlib.contextmanager
def no_kl() -> Iterator[None]:
  """Every layer's KL is a constant 0 (nothing computed, no gradient)."""
  from meshbayes.layers import priors
  saved = priors.NormalPrior.kl
  priors.NormalPrior.kl = lambda self, loc, stddev, params, key: jnp.zeros((), jnp.float32)
  try:
    yield
  finally:
    priors.NormalPrior.kl = saved


# The Bayesian step with one kind of work taken out (``tools/step_profile.py --ablations``);
# "sgd" swaps the optimizer, which the step's spec does, not a context.
WORK_ABLATIONS: dict[str, Callable[[], Any]] = {
    "constant_noise": constant_noise, "no_kl": no_kl, "sgd": contextlib.nullcontext,
}


@contextlib.contextmanager
def jax_random_noise() -> Iterator[None]:
  """Traces the estimators with ``jax.random``'s samplers (the layers' noise before
  ``estimators.standard_normal`` and ``estimators.rademacher``), for comparison."""
  saved = estimators.standard_normal, estimators.rademacher
  estimators.standard_normal = lambda key, shape, dtype=jnp.float32: jax.random.normal(
      key, tuple(shape), dtype)
  estimators.rademacher = lambda key, shape, dtype: jax.random.rademacher(key, tuple(shape),
                                                                          dtype)
  try:
    yield
  finally:
    estimators.standard_normal, estimators.rademacher = saved
