"""Bayesian LeNet-5 (Flipout) against its deterministic twin on scikit-learn's digits.

``LeNet5(estimator=...)`` builds both from one code path; ``train`` fits the
per-example negative ELBO (KL weight ramped to ``--kl_weight``). Scored by
accuracy, NLL, ECE and the AUROC of telling uniform noise from digits by
predictive entropy. ``load_digits_split`` is the digits' split. docs/examples.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from meshbayes import predictive
from meshbayes.layers import KL_COLLECTION, conv_class, dense_class, kl_penalty, total_kl
from meshbayes.metrics import auroc, expected_calibration_error, reliability_bins
from meshbayes.runtime import strict_json

Array = jax.Array
NUM_CLASSES = 10


def load_digits_split(test_fraction: float = 0.2, seed: int = 0
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """scikit-learn's digits as ``(n, 8, 8, 1)`` float32 images in ``[0, 1]``, split stratified.

  >>> x_train, y_train, x_test, y_test = load_digits_split()
  >>> x_train.shape, x_test.shape, float(x_train.max())
  ((1437, 8, 8, 1), (360, 8, 8, 1), 1.0)
  """
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  from sklearn.model_selection import train_test_split  # pylint: disable=import-outside-toplevel
  digits = load_digits()
  images = (digits.images / 16.0).astype(np.float32)[..., None]
  x_train, x_test, y_train, y_test = train_test_split(
      images, digits.target.astype(np.int32), test_size=test_fraction, random_state=seed,
      stratify=digits.target)
  return x_train, y_train, x_test, y_test


class LeNet5(nn.Module):
  """LeNet-5 whose convolutions and dense layers all take one estimator by name.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> model = LeNet5(estimator='flipout')
    >>> variables = jax.jit(model.init)(jax.random.key(0), jnp.ones((2, 8, 8, 1)))
    >>> sorted(variables['params']['conv_0'])
    ['bias', 'kernel_loc', 'kernel_scale']
    >>> logits = jax.jit(lambda v, x, key: model.apply(v, x, rngs={'sample': key}))(
    ...     variables, jnp.ones((2, 8, 8, 1)), jax.random.key(1))
    >>> logits.shape
    (2, 10)

  Attributes:
    estimator: ``'deterministic'``, ``'flipout'`` or another estimator name
      of ``conv_class`` / ``dense_class``.
    num_classes: output classes.
    padding: padding of both convolutions (``'SAME'`` keeps 8x8 inputs 8x8).
  """

  estimator: str = "flipout"
  num_classes: int = NUM_CLASSES
  padding: str = "SAME"

  @nn.compact
  def __call__(self, x: Array, deterministic: bool | None = None) -> Array:
    """Logits ``(batch, num_classes)`` of images ``(batch, height, width, channels)``."""
    conv, dense = conv_class(self.estimator), dense_class(self.estimator)
    x = nn.with_logical_constraint(x, ("batch", None, None, None))
    for i, features in enumerate((6, 16)):
      x = conv(features, (5, 5), padding=self.padding, kernel_axes=(None, None, "embed", "mlp"),
               bias_axes=("mlp",), name=f"conv_{i}")(x, deterministic)
      x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
    x = x.reshape(x.shape[0], -1)
    for i, features in enumerate((120, 84)):
      x = nn.relu(dense(features, kernel_axes=("embed", "mlp"), bias_axes=("mlp",),
                        name=f"dense_{i}")(x, deterministic))
    return dense(self.num_classes, kernel_axes=("embed", "vocab"), bias_axes=("vocab",),
                 name="logits")(x, deterministic)


@dataclasses.dataclass(frozen=True)
class LeNetDigitsConfig:
  """Settings of a run.

  Attributes:
    epochs: passes over the training set.
    batch_size: examples per step.
    learning_rate: Adam's step size.
    kl_weight: weight of the KL term after its ramp: 1 is the ELBO; the default
      0.1 tempers the posterior, which on 1,437 images under a ``N(0, 1)``
      prior is otherwise too wide (underconfident, less accurate).
    num_samples: Flipout forward passes averaged at evaluation.
    test_fraction: held-out fraction of the digits.
    seed: seeds the split, the initialization, the batches and the noise.
  """

  epochs: int = 100
  batch_size: int = 64
  learning_rate: float = 3e-3
  kl_weight: float = 0.1
  num_samples: int = 50
  test_fraction: float = 0.2
  seed: int = 0


def train(model: nn.Module, x_train: np.ndarray, y_train: np.ndarray, key: Array,
          config: LeNetDigitsConfig, mutable_state: Sequence[str] = (),
          train_kwargs: dict[str, object] | None = None) -> tuple[dict, float]:
  """Adam on the per-example negative ELBO (the NLL alone for a deterministic model).

  Args:
    model: a classifier of meshbayes layers, called as ``model(x)`` in training.
    x_train, y_train: the training set.
    key: seeds the initialization, the shuffles and the weight samples.
    config: epochs, batch size, learning rate and KL weight.
    mutable_state: collections updated in training besides the KL
      (``'batch_stats'`` for batch norm).
    train_kwargs: call arguments of the model in training only
      (``use_running_average=False`` for batch norm).

  Returns:
    The trained variables and the training time in seconds.
  """
  key_init, key_shuffle, key_sample = jax.random.split(key, 3)
  num_train = len(x_train)
  variables = model.init(key_init, jnp.asarray(x_train[:1]))
  params = variables["params"]
  state = {k: v for k, v in variables.items() if k != "params"}
  optimizer = optax.adam(config.learning_rate)
  opt_state = optimizer.init(params)
  steps_per_epoch = num_train // config.batch_size
  ramp_steps = max(1, config.epochs * steps_per_epoch // 2)

  def loss_fn(params, state, x, y, key, step):
    logits, new_state = model.apply({"params": params, **state}, x, rngs={"sample": key},
                                    mutable=[KL_COLLECTION, *mutable_state],
                                    **(train_kwargs or {}))
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    kl_weight = config.kl_weight * jnp.minimum(1.0, step / ramp_steps)
    loss = nll + kl_penalty(total_kl(new_state), num_train, kl_weight)
    return loss, {k: new_state[k] for k in mutable_state}

  @jax.jit
  def train_step(params, state, opt_state, x, y, step):
    grads, state = jax.grad(loss_fn, has_aux=True)(
        params, state, x, y, jax.random.fold_in(key_sample, step), step)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), state, opt_state

  start, step = time.perf_counter(), 0
  for epoch in range(config.epochs):
    order = np.asarray(jax.random.permutation(jax.random.fold_in(key_shuffle, epoch), num_train))
    for i in range(steps_per_epoch):
      batch = order[i * config.batch_size:(i + 1) * config.batch_size]
      params, state, opt_state = train_step(params, state, opt_state, x_train[batch],
                                            y_train[batch], step)
      step += 1
  return {"params": params, **state}, time.perf_counter() - start


def sample_log_probs(model: nn.Module, variables: dict, x: np.ndarray, key: Array,
                     num_samples: int) -> Array:
  """Log-probabilities of ``num_samples`` posterior samples, ``(num_samples, n, classes)``.

  A deterministic model (no posterior) gives its softmax once, ``(1, n, classes)``.
  """
  if model.estimator == "deterministic":
    return jax.nn.log_softmax(model.apply(variables, x, deterministic=True))[None]
  apply = jax.jit(lambda k: jax.nn.log_softmax(
      model.apply(variables, x, rngs={"sample": k}, deterministic=False)))
  return predictive.sample_outputs(apply, key, num_samples)


def evaluate(samples: Array, labels: np.ndarray, noise_samples: Array
             ) -> tuple[dict[str, object], tuple[np.ndarray, np.ndarray]]:
  """Scores the predictive distribution, the model average of ``samples``.

  Args:
    samples: ``(num_samples, n, classes)`` log-probabilities of the test digits.
    labels: ``(n,)`` their labels.
    noise_samples: the same of the noise images.

  Returns:
    Accuracy, NLL, ECE, reliability bins and how well the predictive entropy
    (and, given several samples, the mutual information) tells noise from
    digits (AUROC); and the entropies of the digits and of the noise.
  """
  log_probs = predictive.model_average(samples)
  probs = np.exp(np.asarray(log_probs, np.float64))
  confidence, prediction = probs.max(-1), probs.argmax(-1)
  correct = (prediction == labels).astype(np.float64)
  entropy_digits = np.asarray(predictive.entropy(log_probs))
  entropy_noise = np.asarray(predictive.entropy(predictive.model_average(noise_samples)))
  bins = reliability_bins(confidence, correct)
  metrics = {
      "accuracy": float(correct.mean()),
      "nll": float(-np.mean(np.take_along_axis(np.asarray(log_probs), labels[:, None], -1))),
      "ece": expected_calibration_error(confidence, correct),
      "mean_entropy_digits": float(entropy_digits.mean()),
      "mean_entropy_noise": float(entropy_noise.mean()),
      "noise_auroc": auroc(entropy_digits, entropy_noise),
      "reliability": {k: np.asarray(v).tolist() for k, v in bins.items()},
  }
  if samples.shape[0] > 1:  # epistemic part alone: 0 for a single (deterministic) sample
    metrics["noise_auroc_mutual_information"] = auroc(
        predictive.mutual_information(samples), predictive.mutual_information(noise_samples))
  return metrics, (entropy_digits, entropy_noise)


def null_reason(path: str, value: float) -> str:
  """Why a figure of the JSON is null: a reliability bin's means are NaN when no test
  digit's confidence falls in it (ten classes: none below 0.1)."""
  if "/reliability/bin_" in path and math.isnan(value):
    return "nan: an empty bin (no test digit's confidence in it)"
  return strict_json.NAN_REASON if math.isnan(value) else f"{value}: not a finite number"


def run(config: LeNetDigitsConfig, output_dir: str) -> dict[str, object]:
  """Trains both nets, evaluates them, writes the figure and the JSON; returns the numbers."""
  x_train, y_train, x_test, y_test = load_digits_split(config.test_fraction, config.seed)
  key = jax.random.key(config.seed)
  noise = np.asarray(jax.random.uniform(jax.random.fold_in(key, 1), x_test.shape))
  results: dict[str, object] = {"config": dataclasses.asdict(config),
                                "num_train": len(x_train), "num_test": len(x_test),
                                "padding": "SAME"}
  entropies = {}
  for estimator in ("deterministic", "flipout"):
    model = LeNet5(estimator=estimator)
    variables, seconds = train(model, x_train, y_train, jax.random.fold_in(key, 2), config)
    key_eval = jax.random.fold_in(key, 3)
    metrics, entropies[estimator] = evaluate(
        sample_log_probs(model, variables, x_test, key_eval, config.num_samples), y_test,
        sample_log_probs(model, variables, noise, key_eval, config.num_samples))
    metrics["train_seconds"] = seconds
    results[estimator] = metrics

  os.makedirs(output_dir, exist_ok=True)
  _plot(os.path.join(output_dir, "lenet_digits.png"), results, entropies)
  write_json(os.path.join(output_dir, "lenet_digits.json"), results)
  return results


def write_json(path: str, results: dict[str, object]) -> None:
  """``results`` to ``path`` as strict JSON: a NaN figure null, with its reason
  (``null_reason``) under ``null_reasons``."""
  with open(path, "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, explain=null_reason,
                              indent=2))


def _plot(path: str, results: dict[str, object],
          entropies: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 3, figsize=(13, 4))
  axes[0].plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1)
  for estimator, ax in zip(("deterministic", "flipout"), axes[1:]):
    metrics = results[estimator]
    bins = metrics["reliability"]
    filled = np.asarray(bins["bin_count"]) > 0
    axes[0].plot(np.asarray(bins["bin_confidence"])[filled],
                 np.asarray(bins["bin_accuracy"])[filled], marker="o",
                 label=f"{estimator}: acc {metrics['accuracy']:.3f}, ECE {metrics['ece']:.3f}")
    digits, noise = entropies[estimator]
    edges = np.linspace(0, np.log(NUM_CLASSES), 31)
    ax.hist(digits, edges, alpha=0.6, label="test digits")
    ax.hist(noise, edges, alpha=0.6, label="uniform noise")
    ax.set(xlabel="predictive entropy (nats)", ylabel="images",
           title=f"{estimator}: noise AUROC {metrics['noise_auroc']:.3f}")
    ax.legend(fontsize="small")
  axes[0].set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
              title="reliability (10 bins)")
  axes[0].legend(fontsize="small", loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  defaults = LeNetDigitsConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/lenet_digits")
  parser.add_argument("--epochs", type=int, default=defaults.epochs)
  parser.add_argument("--num_samples", type=int, default=defaults.num_samples)
  parser.add_argument("--kl_weight", type=float, default=defaults.kl_weight)
  parser.add_argument("--seed", type=int, default=defaults.seed)
  args = parser.parse_args(argv)
  config = LeNetDigitsConfig(epochs=args.epochs, num_samples=args.num_samples,
                             kl_weight=args.kl_weight, seed=args.seed)
  results = run(config, args.output_dir)
  summary = {e: {k: v for k, v in results[e].items() if k != "reliability"}
             for e in ("deterministic", "flipout")}
  print(strict_json.dumps(summary, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
