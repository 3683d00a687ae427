"""A three-layer deep Gaussian process on scikit-learn's diabetes data (the paper's Figure 5).

The deep GP (doubly stochastic VI), one sparse GP layer, a Bayesian MLP and the
exact GP, each with a trained noise variance and full-batch Adam, scored by test
RMSE and log-likelihood in the target's units. docs/examples.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.examples import full_batch
from meshbayes.layers import KL_COLLECTION, kl_penalty, total_kl
from meshbayes.layers.gaussian_process import (
  GaussianProcess,
  SparseGaussianProcess,
  gaussian_expected_log_likelihood,
)
from meshbayes.models import MLP
from meshbayes.runtime import strict_json

Array = jax.Array
MODELS = ("deep_gp", "sparse_gp", "bayesian_mlp", "exact_gp")
NOISE_INIT = 0.1  # initial noise variance (standardized target)


@dataclasses.dataclass(frozen=True)
class DeepGPDiabetesConfig:
  """Settings of a run.

  Attributes:
    test_fraction: held-out fraction of the 442 patients.
    num_layers: layers of the deep GP (the sparse GP has one).
    hidden_units: width of the deep GP's hidden layers.
    num_inducing: inducing points per sparse GP layer.
    lengthscale_init: initial ARD lengthscale of every GP kernel.
    hidden_scale_init: initial diagonal of ``L_S`` in the deep GP's hidden layers.
    mlp_hidden: hidden widths of the Bayesian MLP.
    steps: Adam steps of each model, full batch.
    learning_rate: Adam's step size.
    num_samples: predictive samples of the models that sample.
    seed: seeds the split, the inducing points, the initialization and the samples.
  """

  test_fraction: float = 0.2
  num_layers: int = 3
  hidden_units: int = 10
  num_inducing: int = 64
  lengthscale_init: float = 2.0
  hidden_scale_init: float = 0.1
  mlp_hidden: tuple[int, ...] = (50,)
  steps: int = 2000
  learning_rate: float = 0.01
  num_samples: int = 200
  seed: int = 0


def load_diabetes(test_fraction: float = 0.2, seed: int = 0) -> dict[str, np.ndarray | float]:
  """The diabetes data split and standardized by the training split.

  Returns ``x_train, y_train, x_test, y_test`` (float32; targets ``(n,)``)
  and the target's training ``y_mean``, ``y_std``.

  >>> data = load_diabetes()
  >>> data['x_train'].shape, data['x_test'].shape, round(float(data['y_train'].std()), 4)
  ((354, 10), (88, 10), 1.0)
  """
  from sklearn.datasets import load_diabetes as sklearn_diabetes  # pylint: disable=import-outside-toplevel
  x, y = sklearn_diabetes(return_X_y=True)
  order = np.random.default_rng(seed).permutation(len(x))
  num_test = int(round(test_fraction * len(x)))
  test, train = order[:num_test], order[num_test:]
  x_mean, x_std = x[train].mean(0), x[train].std(0)
  y_mean, y_std = float(y[train].mean()), float(y[train].std())
  as_x = lambda idx: ((x[idx] - x_mean) / x_std).astype(np.float32)
  as_y = lambda idx: ((y[idx] - y_mean) / y_std).astype(np.float32)
  return {"x_train": as_x(train), "y_train": as_y(train), "x_test": as_x(test),
          "y_test": as_y(test), "y_mean": y_mean, "y_std": y_std}


def _fixed(value: np.ndarray) -> Callable:
  """An initializer returning ``value`` (inducing inputs from the data)."""
  return lambda key, shape, dtype=jnp.float32: jnp.asarray(value, dtype).reshape(shape)


class DeepGP(nn.Module):
  """Sparse GP layers stacked; returns the last layer's marginals ``(mean, variance)`` ``(n,)``.

  Attributes:
    inducing_inputs: initial inducing inputs of each layer (its input space).
    projections: the linear mean function of each hidden layer, ``(in, out)``.
    hidden_units: width of the hidden layers.
    lengthscale_init: initial ARD lengthscale.
    hidden_scale_init: initial diagonal of ``L_S`` in the hidden layers.
  """

  inducing_inputs: Sequence[np.ndarray]
  projections: Sequence[np.ndarray]
  hidden_units: int
  lengthscale_init: float
  hidden_scale_init: float = 0.1

  @nn.compact
  def __call__(self, x: Array) -> tuple[Array, Array]:
    h = x
    num_layers = len(self.inducing_inputs)
    for i, z in enumerate(self.inducing_inputs):
      last = i == num_layers - 1
      mean_fn = None if last else (lambda t, w=jnp.asarray(self.projections[i]): t @ w)
      h = SparseGaussianProcess(
          units=1 if last else self.hidden_units, num_inducing=len(z), ard=True,
          lengthscale_init=self.lengthscale_init, mean_fn=mean_fn,
          inducing_inputs_init=_fixed(z), scale_init=1.0 if last else self.hidden_scale_init,
          name=f"layer_{i}")(h)
    return h.mean()[..., 0], h.variance()[..., 0]


class BayesianMLP(nn.Module):
  """``meshbayes.models.MLP`` of ``DenseReparameterization`` layers, one output; variance 0."""

  hidden: Sequence[int]

  @nn.compact
  def __call__(self, x: Array) -> tuple[Array, Array]:
    mlp = MLP(hidden_dims=tuple(self.hidden), num_classes=1,
              estimators=("reparameterization",) * (len(self.hidden) + 1), activation=nn.relu)
    f = mlp(x)[..., 0]
    return f, jnp.zeros_like(f)


def _principal_directions(x: np.ndarray, width: int) -> np.ndarray:
  """The identity when ``width`` equals the features, else the top principal directions."""
  if width == x.shape[1]:
    return np.eye(width, dtype=np.float32)
  _, _, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)
  return vt[:width].T.astype(np.float32)


def deep_gp(x_train: np.ndarray, num_layers: int, config: DeepGPDiabetesConfig) -> DeepGP:
  """The deep GP of ``num_layers`` layers, inducing inputs from a subset of ``x_train``."""
  rng = np.random.default_rng(config.seed)
  subset = x_train[rng.choice(len(x_train), config.num_inducing, replace=False)]
  projections, inducing = [], [subset]
  for i in range(num_layers - 1):
    width_in = x_train.shape[1] if i == 0 else config.hidden_units
    projection = (_principal_directions(x_train, config.hidden_units) if i == 0
                  else np.eye(width_in, config.hidden_units, dtype=np.float32))
    projections.append(projection)
    inducing.append(inducing[-1] @ projection)
  return DeepGP(inducing_inputs=tuple(inducing), projections=tuple(projections),
                hidden_units=config.hidden_units, lengthscale_init=config.lengthscale_init,
                hidden_scale_init=config.hidden_scale_init)


def train(model: nn.Module, data: dict, key: Array, config: DeepGPDiabetesConfig
          ) -> tuple[dict, list[float], float]:
  """Adam on the negative ELBO per training point; returns parameters, curve, seconds.

  The parameters are the model's and ``raw_noise`` (noise variance ``softplus(raw_noise)``).
  """
  x, y = jnp.asarray(data["x_train"]), jnp.asarray(data["y_train"])
  key_init, key_train = jax.random.split(key)
  params = {"model": nn.unbox(jax.jit(model.init)(key_init, x)["params"]),
            "raw_noise": jnp.asarray(math.log(math.expm1(NOISE_INIT)), jnp.float32)}

  def loss_fn(params, key):
    (mean, variance), state = model.apply({"params": params["model"]}, x,
                                          rngs={"sample": key}, mutable=[KL_COLLECTION])
    noise = jax.nn.softplus(params["raw_noise"])
    expected = jnp.mean(gaussian_expected_log_likelihood(y, mean, variance, noise))
    return -expected + kl_penalty(total_kl(state), len(y))

  return full_batch.fit(loss_fn, params, config.learning_rate, key_train, config.steps)


def predict(model: nn.Module, params: dict, x: np.ndarray, key: Array, num_samples: int
            ) -> tuple[np.ndarray, np.ndarray]:
  """``num_samples`` predictive Gaussians per point: means and variances ``(S, n)``, noise added."""
  noise = jax.nn.softplus(params["raw_noise"])

  def one(k):
    mean, variance = model.apply({"params": params["model"]}, jnp.asarray(x), rngs={"sample": k})
    return mean, variance + noise

  means, variances = jax.jit(lambda ks: jax.lax.map(one, ks))(jax.random.split(key, num_samples))
  return np.asarray(means, np.float64), np.asarray(variances, np.float64)


def train_exact_gp(data: dict, config: DeepGPDiabetesConfig
                   ) -> tuple[GaussianProcess, dict, list[float], float]:
  """The exact GP's kernel and noise by Adam on the negative log marginal likelihood per point."""
  x, y = jnp.asarray(data["x_train"]), jnp.asarray(data["y_train"])[:, None]
  gp = GaussianProcess(units=1, ard=True, lengthscale_init=config.lengthscale_init,
                       noise_variance_init=NOISE_INIT)
  params = nn.unbox(jax.jit(gp.init)(jax.random.key(config.seed), x)["params"])
  loss_fn = lambda p, key: -jnp.sum(gp.apply({"params": p}, x).log_prob(y.T)) / len(x)
  params, curve, seconds = full_batch.fit(loss_fn, params, config.learning_rate,
                                          jax.random.key(0), config.steps)  # no randomness
  return gp, params, curve, seconds


def scores(means: np.ndarray, variances: np.ndarray, y: np.ndarray, y_std: float
           ) -> dict[str, float]:
  """RMSE of the mixture mean and log-likelihood per point of the mixture, in the target's units.

  >>> s = scores(np.zeros((1, 2)), np.ones((1, 2)), np.zeros(2), y_std=1.0)
  >>> s['rmse'], round(s['log_likelihood'], 4)
  (0.0, -0.9189)
  """
  log_probs = -0.5 * (np.log(2 * np.pi * variances) + np.square(y - means) / variances)
  mixture = np.logaddexp.reduce(log_probs, axis=0) - np.log(len(means))
  rmse = float(np.sqrt(np.mean(np.square(means.mean(0) - y))))
  return {"rmse": rmse * y_std, "log_likelihood": float(np.mean(mixture) - np.log(y_std))}


def run(config: DeepGPDiabetesConfig, output_dir: str) -> dict[str, object]:
  """Trains the four models, scores them on the test split, writes the figure and the JSON."""
  data = load_diabetes(config.test_fraction, config.seed)
  y_test, y_std = data["y_test"].astype(np.float64), data["y_std"]
  key = jax.random.key(config.seed)
  results: dict[str, object] = {
      "config": dataclasses.asdict(config),
      "num_train": len(data["x_train"]), "num_test": len(y_test), "target_std": y_std,
      "training_mean": scores(np.zeros((1, len(y_test))), np.ones((1, len(y_test))), y_test,
                              y_std),
  }
  curves, predictions = {}, {}
  models = {"deep_gp": deep_gp(data["x_train"], config.num_layers, config),
            "sparse_gp": deep_gp(data["x_train"], 1, config),
            "bayesian_mlp": BayesianMLP(hidden=config.mlp_hidden)}
  for index, (name, model) in enumerate(models.items()):
    params, curves[name], seconds = train(model, data, jax.random.fold_in(key, index), config)
    samples = 1 if name == "sparse_gp" else config.num_samples  # the sparse GP does not sample
    means, variances = predict(model, params, data["x_test"], jax.random.fold_in(key, 10 + index),
                               samples)
    predictions[name] = (means.mean(0), np.sqrt(np.mean(variances + means ** 2, 0)
                                                - means.mean(0) ** 2))
    results[name] = {**scores(means, variances, y_test, y_std), "train_seconds": seconds,
                     "final_loss": curves[name][-1],
                     "noise_variance": float(jax.nn.softplus(params["raw_noise"])),
                     "num_params": int(sum(np.size(p) for p in jax.tree.leaves(params)))}
  gp, params, curves["exact_gp"], seconds = train_exact_gp(data, config)
  moments = jax.jit(lambda p: (lambda d: (d.mean(), d.variance()))(gp.apply(
      {"params": p}, data["x_test"], data["x_train"], data["y_train"][:, None])))
  mean, variance = (np.asarray(m, np.float64) for m in moments(params))
  predictions["exact_gp"] = (mean[0], np.sqrt(variance[0]))
  results["exact_gp"] = {**scores(mean, variance, y_test, y_std), "train_seconds": seconds,
                         "final_loss": curves["exact_gp"][-1],
                         "noise_variance": float(jax.nn.softplus(params["raw_noise_variance"]))}
  os.makedirs(output_dir, exist_ok=True)
  _plot(os.path.join(output_dir, "deep_gp_diabetes.png"), curves, predictions, y_test, results)
  with open(os.path.join(output_dir, "deep_gp_diabetes.json"), "w") as f:
    f.write(strict_json.dumps({**results, "loss_curves_every_20_steps": curves},
                              null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def _plot(path: str, curves: dict, predictions: dict, y_test: np.ndarray,
          results: dict[str, object]) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 1 + len(MODELS), figsize=(5 + 3.2 * len(MODELS), 4))
  for name in MODELS:
    steps = np.arange(len(curves[name])) * 20
    axes[0].plot(steps, curves[name], label=name)
  lowest = min(min(curve) for curve in curves.values())
  axes[0].set(xlabel="step", ylabel="per training point (standardized)",
              title="negative ELBO (exact GP: -log evidence)", ylim=(lowest - 0.1, 3.0))
  axes[0].title.set_fontsize("small")
  axes[0].legend(fontsize="small")
  for ax, name in zip(axes[1:], MODELS):
    mean, std = predictions[name]
    ax.errorbar(y_test, mean, yerr=2 * std, fmt="o", markersize=3, alpha=0.6, elinewidth=0.7)
    ax.plot([-2.5, 3], [-2.5, 3], color="black", linewidth=0.8)
    r = results[name]
    ax.set(xlabel="test target (standardized)", ylabel="predictive mean ±2 sd",
           title=f"{name}: RMSE {r['rmse']:.1f}, LL {r['log_likelihood']:.3f}")
    ax.title.set_fontsize("small")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  defaults = DeepGPDiabetesConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/deep_gp_diabetes")
  parser.add_argument("--test_fraction", type=float, default=defaults.test_fraction)
  parser.add_argument("--num_layers", type=int, default=defaults.num_layers)
  parser.add_argument("--hidden_units", type=int, default=defaults.hidden_units)
  parser.add_argument("--num_inducing", type=int, default=defaults.num_inducing)
  parser.add_argument("--lengthscale_init", type=float, default=defaults.lengthscale_init)
  parser.add_argument("--hidden_scale_init", type=float, default=defaults.hidden_scale_init)
  parser.add_argument("--mlp_hidden", type=int, nargs="+", default=list(defaults.mlp_hidden))
  parser.add_argument("--steps", type=int, default=defaults.steps)
  parser.add_argument("--learning_rate", type=float, default=defaults.learning_rate)
  parser.add_argument("--num_samples", type=int, default=defaults.num_samples)
  parser.add_argument("--seed", type=int, default=defaults.seed)
  args = parser.parse_args(argv)
  config = DeepGPDiabetesConfig(
      test_fraction=args.test_fraction, num_layers=args.num_layers,
      hidden_units=args.hidden_units, num_inducing=args.num_inducing,
      lengthscale_init=args.lengthscale_init, hidden_scale_init=args.hidden_scale_init,
      mlp_hidden=tuple(args.mlp_hidden),
      steps=args.steps, learning_rate=args.learning_rate, num_samples=args.num_samples,
      seed=args.seed)
  results = run(config, args.output_dir)
  print(strict_json.dumps({k: v for k, v in results.items() if k != "config"},
                         null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
