"""Bayesian regression of ``10 sin(2 pi x)``: the epistemic band widens away from the data.

An MLP of Bayesian Dense layers fitted to ``NUM_POINTS`` noisy points on
``[-0.5, 0.5]`` (noise ``NOISE_STDDEV``); whole functions drawn on ``[-1, 1]``.
The check: the epistemic stddev outside the data is ``--min_ratio`` times that
inside. docs/examples.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from meshbayes.layers import KL_COLLECTION, kl_penalty, sample_weights, total_kl
from meshbayes.models import MLP
from meshbayes.runtime import strict_json

Array = jax.Array

NUM_POINTS = 32
NOISE_STDDEV = 1.0
DATA_RANGE = 0.5  # inputs on [-DATA_RANGE, DATA_RANGE]
PLOT_RANGE = 1.0  # predictions on [-PLOT_RANGE, PLOT_RANGE]


@dataclasses.dataclass(frozen=True)
class SinRegressionConfig:
  """Settings of a run.

  Attributes:
    steps: Adam steps, each on the full batch of 32 points.
    hidden: widths of the hidden layers.
    estimator: ``reparameterization`` or ``flipout`` (any Dense estimator name).
    learning_rate: Adam's step size.
    num_samples: posterior samples (functions) drawn for the bands.
    num_grid: grid points on ``[-1, 1]``.
    min_ratio: the epistemic widening (outside / inside) the run must reach.
    seed: seeds the data, the initialization and the samples.
  """

  steps: int = 3000
  hidden: tuple[int, ...] = (64, 64)
  estimator: str = "reparameterization"
  learning_rate: float = 1e-2
  num_samples: int = 500
  num_grid: int = 201
  min_ratio: float = 2.0
  seed: int = 0


def make_data(key: Array, num_points: int = NUM_POINTS) -> tuple[Array, Array]:
  """``num_points`` inputs on ``[-0.5, 0.5]`` and their noisy targets, shapes ``(n, 1)``.

  >>> x, y = make_data(jax.random.key(0))
  >>> x.shape, bool(jnp.all(jnp.abs(x) <= 0.5))
  ((32, 1), True)
  """
  key_x, key_noise = jax.random.split(key)
  x = jax.random.uniform(key_x, (num_points, 1), minval=-DATA_RANGE, maxval=DATA_RANGE)
  y = 10.0 * jnp.sin(2.0 * jnp.pi * x) + NOISE_STDDEV * jax.random.normal(key_noise, x.shape)
  return x, y


def epistemic_ratio(grid: np.ndarray, epistemic: np.ndarray) -> float:
  """Mean epistemic stddev outside ``[-0.5, 0.5]`` over its mean inside.

  >>> epistemic_ratio(np.array([-1.0, 0.0, 1.0]), np.array([3.0, 1.0, 3.0]))
  3.0
  """
  outside = np.abs(grid) > DATA_RANGE
  return float(np.mean(epistemic[outside]) / np.mean(epistemic[~outside]))


def run(config: SinRegressionConfig, output_dir: str) -> dict[str, object]:
  """Trains, predicts the bands, writes the figure and the JSON; returns the JSON's numbers."""
  key_data, key_init, key_train, key_predict = jax.random.split(jax.random.key(config.seed), 4)
  x, y = make_data(key_data)
  model = MLP(hidden_dims=config.hidden, num_classes=1,
              estimators=(config.estimator,) * (len(config.hidden) + 1), activation=nn.relu)
  params = model.init(key_init, x)["params"]
  optimizer = optax.adam(config.learning_rate)
  opt_state = optimizer.init(params)

  def loss_fn(params, key):
    mean, state = model.apply({"params": params}, x, rngs={"sample": key},
                              mutable=[KL_COLLECTION])
    nll = jnp.mean(0.5 * jnp.square((y - mean) / NOISE_STDDEV)
                   + jnp.log(NOISE_STDDEV) + 0.5 * jnp.log(2 * jnp.pi))
    kl = total_kl(state)
    return nll + kl_penalty(kl, NUM_POINTS), (nll, kl)

  @jax.jit
  def train_step(params, opt_state, step):
    grads, aux = jax.grad(loss_fn, has_aux=True)(params, jax.random.fold_in(key_train, step))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, aux

  start = time.perf_counter()
  for step in range(config.steps):
    params, opt_state, (nll, kl) = train_step(params, opt_state, step)
  train_seconds = time.perf_counter() - start

  grid = jnp.linspace(-PLOT_RANGE, PLOT_RANGE, config.num_grid)[:, None]

  @jax.jit
  def function_sample(key):  # one weight sample, the whole grid under it
    return model.apply({"params": sample_weights(params, key)}, grid, deterministic=True)[:, 0]

  keys = jax.random.split(key_predict, config.num_samples)
  samples = np.asarray(jax.lax.map(function_sample, keys))  # (num_samples, num_grid)
  grid = np.asarray(grid[:, 0])
  mean, epistemic = samples.mean(0), samples.std(0)
  predictive = np.sqrt(np.square(epistemic) + NOISE_STDDEV ** 2)
  inside = np.abs(grid) <= DATA_RANGE
  ratio = epistemic_ratio(grid, epistemic)
  truth = 10.0 * np.sin(2.0 * np.pi * grid)
  results = {
      "config": dataclasses.asdict(config),
      "noise_stddev": NOISE_STDDEV,
      "num_points": NUM_POINTS,
      "final_nll": float(nll),
      "final_kl": float(kl),
      "train_seconds": train_seconds,
      "rmse_inside_vs_truth": float(np.sqrt(np.mean(np.square(mean - truth)[inside]))),
      "epistemic_stddev_inside": float(np.mean(epistemic[inside])),
      "epistemic_stddev_outside": float(np.mean(epistemic[~inside])),
      "epistemic_ratio_outside_over_inside": ratio,
      "min_ratio": config.min_ratio,
      "passes": ratio >= config.min_ratio,
  }

  os.makedirs(output_dir, exist_ok=True)
  _plot(os.path.join(output_dir, "sin_regression.png"), np.asarray(x[:, 0]), np.asarray(y[:, 0]),
        grid, truth, mean, epistemic, predictive, samples[:10], ratio)
  with open(os.path.join(output_dir, "sin_regression.json"), "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def _plot(path: str, x: np.ndarray, y: np.ndarray, grid: np.ndarray, truth: np.ndarray,
          mean: np.ndarray, epistemic: np.ndarray, predictive: np.ndarray,
          samples: np.ndarray, ratio: float) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7, 4.5))
  ax.fill_between(grid, mean - 2 * predictive, mean + 2 * predictive, color="tab:blue",
                  alpha=0.15, label="predictive ±2 sd (epistemic + noise)")
  ax.fill_between(grid, mean - 2 * epistemic, mean + 2 * epistemic, color="tab:blue",
                  alpha=0.35, label="epistemic ±2 sd")
  for sample in samples:
    ax.plot(grid, sample, color="tab:blue", linewidth=0.5, alpha=0.5)
  ax.plot(grid, mean, color="tab:blue", label="predictive mean")
  ax.plot(grid, truth, color="black", linestyle="--", linewidth=1, label="10 sin(2πx)")
  ax.scatter(x, y, color="tab:red", s=12, zorder=3, label=f"{x.size} noisy points")
  ax.axvspan(-DATA_RANGE, DATA_RANGE, color="gray", alpha=0.08)
  ax.set(xlim=(-PLOT_RANGE, PLOT_RANGE), ylim=(-30, 30), xlabel="x", ylabel="y",
         title=f"Bayesian MLP: epistemic sd outside / inside the data = {ratio:.1f}")
  ax.legend(loc="lower center", ncol=2, fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  defaults = SinRegressionConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/sin_regression")
  parser.add_argument("--steps", type=int, default=defaults.steps)
  parser.add_argument("--hidden", type=int, nargs="+", default=list(defaults.hidden))
  parser.add_argument("--estimator", default=defaults.estimator,
                      choices=("reparameterization", "flipout", "local_reparameterization"))
  parser.add_argument("--num_samples", type=int, default=defaults.num_samples)
  parser.add_argument("--min_ratio", type=float, default=defaults.min_ratio)
  parser.add_argument("--seed", type=int, default=defaults.seed)
  args = parser.parse_args(argv)
  config = SinRegressionConfig(steps=args.steps, hidden=tuple(args.hidden),
                               estimator=args.estimator, num_samples=args.num_samples,
                               min_ratio=args.min_ratio, seed=args.seed)
  results = run(config, args.output_dir)
  print(strict_json.dumps({k: v for k, v in results.items() if k != "config"},
                         null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
