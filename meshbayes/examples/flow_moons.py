"""A normalizing flow of MADE-conditioned RealNVP layers on two moons (Figure 7 in miniature).

``moons_flow`` maps ``N(0, I)`` to scikit-learn's two moons by maximum
likelihood; scored by test log-likelihood against the base Gaussian and a
Gaussian mixture. docs/examples.md.
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
from tensorflow_probability.substrates import jax as tfp

from meshbayes.layers.reversible import MADE, Flow, RealNVP, Reverse
from meshbayes.runtime import strict_json

tfd = tfp.distributions
Array = jax.Array
LOG_SCALE_BOUND = 3.0  # each layer scales by at most e^3: finite densities far from the data


@dataclasses.dataclass(frozen=True)
class FlowMoonsConfig:
  """Settings of a run.

  Attributes:
    num_points: points drawn from ``make_moons`` (train and test together).
    noise: ``make_moons``'s Gaussian noise.
    test_fraction: held-out fraction.
    num_layers: RealNVP layers (with a ``Reverse`` between consecutive ones).
    hidden: hidden widths of each MADE conditioner.
    steps: Adam steps.
    batch_size: points per step.
    learning_rate: Adam's initial step size (cosine-decayed to 0).
    num_samples: flow samples drawn for the figure.
    seed: seeds the data, the split, the initialization, batches and samples.
  """

  num_points: int = 2000
  noise: float = 0.05
  test_fraction: float = 0.2
  num_layers: int = 6
  hidden: tuple[int, ...] = (64, 64)
  steps: int = 4000
  batch_size: int = 256
  learning_rate: float = 2e-3
  num_samples: int = 1000
  seed: int = 0


def load_moons(num_points: int = 2000, noise: float = 0.05, test_fraction: float = 0.2,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Two moons split and standardized by the training split: ``(train, test, mean, std)``.

  >>> train, test, mean, std = load_moons(100)
  >>> train.shape, test.shape, bool(np.allclose(train.mean(0), 0, atol=1e-6))
  ((80, 2), (20, 2), True)
  """
  from sklearn.datasets import make_moons  # pylint: disable=import-outside-toplevel
  points, _ = make_moons(num_points, noise=noise, random_state=seed)
  order = np.random.default_rng(seed).permutation(num_points)
  num_test = int(round(test_fraction * num_points))
  test, train = points[order[:num_test]], points[order[num_test:]]
  mean, std = train.mean(0), train.std(0)
  standardize = lambda p: ((p - mean) / std).astype(np.float32)
  return standardize(train), standardize(test), mean, std


def moons_flow(num_layers: int = 6, hidden: Sequence[int] = (64, 64)) -> Flow:
  """RealNVP layers with MADE conditioners and ``Reverse`` between them.

  Built outside any module, so each layer owns its conditioner, as
  transforming a distribution needs.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> model = moons_flow(num_layers=2, hidden=(8,))
    >>> base = tfd.MultivariateNormalDiag(jnp.zeros(2))
    >>> variables = model.init(jax.random.key(0), base)
    >>> float(model.apply(variables, base).log_prob(jnp.zeros(2)))  # the identity at init
    -1.837877...

  Args:
    num_layers: RealNVP layers.
    hidden: hidden widths of each MADE.
  """
  layers: list[nn.Module] = []
  for i in range(num_layers):
    if i:
      layers.append(Reverse())
    made = MADE(num_params=2, hidden_dims=tuple(hidden),
                output_kernel_init=nn.initializers.zeros_init())
    layers.append(RealNVP(num_masked=0, conditioner=made, log_scale_bound=LOG_SCALE_BOUND))
  return Flow(layers)


def base_distribution() -> tfd.Distribution:
  return tfd.MultivariateNormalDiag(jnp.zeros(2))


def train(model: Flow, train_points: np.ndarray, key: Array, config: FlowMoonsConfig
          ) -> tuple[dict, list[float], float]:
  """Adam on the mean negative log-likelihood; returns variables, loss curve, seconds."""
  key_init, key_batch = jax.random.split(key)
  base = base_distribution()
  variables = model.init(key_init, base)
  params = variables["params"]
  optimizer = optax.adam(optax.cosine_decay_schedule(config.learning_rate, config.steps))
  opt_state = optimizer.init(params)

  def loss_fn(params, batch):
    return -jnp.mean(model.apply({"params": params}, base).log_prob(batch))

  @jax.jit
  def step(params, opt_state, index):
    batch = jnp.asarray(train_points)[jax.random.choice(
        jax.random.fold_in(key_batch, index), len(train_points), (config.batch_size,))]
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  losses, start = [], time.perf_counter()
  for i in range(config.steps):
    params, opt_state, loss = step(params, opt_state, i)
    if i % 50 == 0 or i == config.steps - 1:
      losses.append(float(loss))
  return {"params": params}, losses, time.perf_counter() - start


def log_likelihood(model: Flow, variables: dict, points: np.ndarray) -> float:
  """Mean log-density of ``points`` under the flow, nats per point (standardized coordinates)."""
  log_prob = jax.jit(lambda v, p: model.apply(v, base_distribution()).log_prob(p))
  return float(jnp.mean(log_prob(variables, jnp.asarray(points))))


def run(config: FlowMoonsConfig, output_dir: str) -> dict[str, object]:
  """Trains the flow, evaluates it against the base and a Gaussian mixture, writes outputs."""
  from sklearn.mixture import GaussianMixture  # pylint: disable=import-outside-toplevel
  train_points, test_points, _, std = load_moons(config.num_points, config.noise,
                                                 config.test_fraction, config.seed)
  key = jax.random.key(config.seed)
  model = moons_flow(config.num_layers, config.hidden)
  variables, losses, seconds = train(model, train_points, jax.random.fold_in(key, 1), config)
  to_data = -float(np.sum(np.log(std)))  # log-density in the data's coordinates: + log|d z/d x|
  base = base_distribution()
  gmm = GaussianMixture(10, covariance_type="full", random_state=config.seed).fit(train_points)
  scores = {
      "flow_test": log_likelihood(model, variables, test_points),
      "flow_train": log_likelihood(model, variables, train_points),
      "base_gaussian_test": float(jnp.mean(base.log_prob(test_points))),
      "gmm10_test": float(gmm.score(test_points)),
  }
  results: dict[str, object] = {
      "config": dataclasses.asdict(config),
      "num_train": len(train_points), "num_test": len(test_points),
      "num_params": int(sum(p.size for p in jax.tree.leaves(variables))),
      "log_likelihood_standardized": scores,
      "log_likelihood_data_coordinates": {k: v + to_data for k, v in scores.items()},
      "flow_minus_base_test": scores["flow_test"] - scores["base_gaussian_test"],
      "train_seconds": seconds,
      "loss_curve_every_50_steps": losses,
  }
  samples = np.asarray(jax.jit(lambda k: model.apply(variables, base).sample(
      config.num_samples, seed=k))(jax.random.fold_in(key, 2)))
  results["sample_mean"] = samples.mean(0).tolist()
  results["sample_std"] = samples.std(0).tolist()
  os.makedirs(output_dir, exist_ok=True)
  _plot(os.path.join(output_dir, "flow_moons.png"), model, variables, test_points, samples,
        results)
  with open(os.path.join(output_dir, "flow_moons.json"), "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def _plot(path: str, model: Flow, variables: dict, test_points: np.ndarray,
          samples: np.ndarray, results: dict[str, object]) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  grid = np.linspace(-3, 3, 150, dtype=np.float32)
  xx, yy = np.meshgrid(grid, grid)
  points = np.stack([xx.ravel(), yy.ravel()], -1)
  log_density = np.asarray(jax.jit(lambda p: model.apply(variables, base_distribution()
                                                         ).log_prob(p))(points))
  scores = results["log_likelihood_standardized"]
  fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
  axes[0].scatter(test_points[:, 0], test_points[:, 1], s=4)
  axes[0].set_title(f"test points ({len(test_points)})")
  image = axes[1].imshow(np.exp(log_density).reshape(xx.shape), origin="lower",
                         extent=(-3, 3, -3, 3), cmap="viridis")
  fig.colorbar(image, ax=axes[1], fraction=0.046)
  axes[1].set_title(f"flow density: test {scores['flow_test']:.3f} nats/pt "
                    f"(base {scores['base_gaussian_test']:.3f})", fontsize="small")
  axes[2].scatter(samples[:, 0], samples[:, 1], s=4, color="tab:orange")
  axes[2].set_title(f"flow samples ({len(samples)})")
  for ax in axes:
    ax.set(xlim=(-3, 3), ylim=(-3, 3), aspect="equal")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  defaults = FlowMoonsConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/flow_moons")
  parser.add_argument("--num_points", type=int, default=defaults.num_points)
  parser.add_argument("--num_layers", type=int, default=defaults.num_layers)
  parser.add_argument("--hidden", type=int, nargs="+", default=list(defaults.hidden))
  parser.add_argument("--steps", type=int, default=defaults.steps)
  parser.add_argument("--batch_size", type=int, default=defaults.batch_size)
  parser.add_argument("--learning_rate", type=float, default=defaults.learning_rate)
  parser.add_argument("--num_samples", type=int, default=defaults.num_samples)
  parser.add_argument("--seed", type=int, default=defaults.seed)
  args = parser.parse_args(argv)
  config = FlowMoonsConfig(num_points=args.num_points, num_layers=args.num_layers,
                           hidden=tuple(args.hidden), steps=args.steps,
                           batch_size=args.batch_size, learning_rate=args.learning_rate,
                           num_samples=args.num_samples, seed=args.seed)
  results = run(config, args.output_dir)
  print(strict_json.dumps({k: v for k, v in results.items() if k != "loss_curve_every_50_steps"},
                         null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
