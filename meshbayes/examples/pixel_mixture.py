"""Autoregressive discretized logistic mixture of scikit-learn's digits (Figure 6 in miniature).

``PixelMixture``: a ``MADE`` gives each pixel's ``MixtureLogistic``, binned to the
17 grey levels by ``Discretize``; scored in test bits per pixel against a
uniform and per-pixel histograms. docs/examples.md.
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

from meshbayes.layers.reversible import MADE
from meshbayes.layers.stochastic_outputs import Discretize, MixtureLogistic
from meshbayes.runtime import strict_json

Array = jax.Array
LEVELS = 17  # grey levels 0..16
NUM_PIXELS = 64


def load_pixels(test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """The digits as ``(n, 64)`` float32 integers 0..16 in raster order, split train/test.

  >>> train, test = load_pixels()
  >>> train.shape, test.shape, float(train.max())
  ((1437, 64), (360, 64), 16.0)
  """
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  from sklearn.model_selection import train_test_split  # pylint: disable=import-outside-toplevel
  digits = load_digits()
  train, test = train_test_split(digits.data.astype(np.float32), test_size=test_fraction,
                                 random_state=seed, stratify=digits.target)
  return train, test


class PixelMixture(nn.Module):
  """``p(x_d | x_<d)`` for every pixel at once: a discretized logistic mixture per pixel.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> model = PixelMixture(num_components=2, hidden=(16,))
    >>> x = jnp.zeros((3, 64))
    >>> variables = model.init(jax.random.key(0), x)
    >>> model.apply(variables, x).log_prob(x).shape
    (3, 64)

  Attributes:
    num_components: logistic components per pixel.
    hidden: widths of the MADE's masked hidden layers.
    min_scale: floor of every component's scale, in grey levels.
  """

  num_components: int = 5
  hidden: Sequence[int] = (256, 256)
  min_scale: float = 0.05

  @nn.compact
  def __call__(self, pixels: Array):
    """Returns the distribution of every pixel given the earlier ones (batch shape ``(n, 64)``)."""
    k = self.num_components
    scaled = pixels / (LEVELS - 1) - 0.5
    params = MADE(num_params=3 * k, hidden_dims=tuple(self.hidden), name="made")(scaled)
    # Locations start spread over the grey levels instead of all at 0.
    logits, loc, raw_scale = jnp.split(params, 3, axis=-1)
    offsets = jnp.linspace(0.0, LEVELS - 1.0, k)
    params = jnp.concatenate([logits, offsets + 4.0 * loc, raw_scale], axis=-1)
    mixture = MixtureLogistic(num_components=k, min_scale=self.min_scale, name="mixture")(params)
    return Discretize(low=0, high=LEVELS - 1, name="discretize")(mixture)


@dataclasses.dataclass(frozen=True)
class PixelMixtureConfig:
  """Settings of a run.

  Attributes:
    num_components: logistic components per pixel.
    hidden: widths of the MADE's hidden layers.
    steps: Adam steps.
    batch_size: images per step.
    learning_rate: Adam's peak step size (cosine decay to 10% of it).
    weight_decay: decoupled weight decay (AdamW, scaled by the step size).
    num_samples: images drawn pixel by pixel for the figure.
    test_fraction: held-out fraction of the digits.
    seed: seeds the split, the initialization, the batches and the samples.
  """

  num_components: int = 5
  hidden: tuple[int, ...] = (256, 256)
  steps: int = 1500
  batch_size: int = 128
  learning_rate: float = 1e-3
  weight_decay: float = 0.1
  num_samples: int = 32
  test_fraction: float = 0.2
  seed: int = 0


def bits_per_dim(nll_nats_per_image: float) -> float:
  """Nats per image to bits per pixel (dimension)."""
  return nll_nats_per_image / (NUM_PIXELS * math.log(2.0))


def histogram_bits_per_dim(train: np.ndarray, test: np.ndarray) -> float:
  """Independent per-pixel histograms of ``train`` (add-one smoothed), on ``test``."""
  counts = np.stack([(train == v).sum(0) for v in range(LEVELS)], -1) + 1.0
  probs = counts / counts.sum(-1, keepdims=True)
  log_p = np.log(np.take_along_axis(probs, test.astype(int).T, axis=1))  # (64, n)
  return bits_per_dim(-log_p.sum(0).mean())


def sample_images(model: PixelMixture, params: dict, key: Array, num: int) -> Array:
  """Draws ``num`` images pixel by pixel (64 passes; pixel ``d`` given the ``d`` drawn before)."""

  def step(d, carry):
    canvas, key = carry
    key, sub = jax.random.split(key)
    drawn = model.apply({"params": params}, canvas).sample(seed=sub)
    return canvas.at[:, d].set(drawn[:, d]), key

  canvas = jnp.zeros((num, NUM_PIXELS), jnp.float32)
  return jax.lax.fori_loop(0, NUM_PIXELS, step, (canvas, key))[0]


def run(config: PixelMixtureConfig, output_dir: str) -> dict[str, object]:
  """Trains the model, evaluates test bits/dim, draws samples, writes the figure and JSON."""
  train, test = load_pixels(config.test_fraction, config.seed)
  model = PixelMixture(num_components=config.num_components, hidden=config.hidden)
  key = jax.random.key(config.seed)
  init_key, batch_key, sample_key = jax.random.split(key, 3)
  params = nn.unbox(model.init(init_key, jnp.asarray(train[:2]))["params"])
  schedule = optax.cosine_decay_schedule(config.learning_rate, config.steps, alpha=0.1)
  optimizer = optax.adamw(schedule, weight_decay=config.weight_decay)
  opt_state = optimizer.init(params)

  def nll(params, batch):
    return -model.apply({"params": params}, batch).log_prob(batch).sum(-1).mean()

  @jax.jit
  def update(params, opt_state, batch):
    loss, grads = jax.value_and_grad(nll)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  train_j, test_j = jnp.asarray(train), jnp.asarray(test)
  evaluate = jax.jit(nll)
  start = time.perf_counter()
  curve = []
  for step in range(config.steps):
    idx = jax.random.choice(jax.random.fold_in(batch_key, step), len(train),
                            (config.batch_size,), replace=False)
    params, opt_state, loss = update(params, opt_state, train_j[idx])
    if step % 50 == 0 or step == config.steps - 1:
      curve.append((step, bits_per_dim(float(loss)),
                    bits_per_dim(float(evaluate(params, test_j)))))
  train_seconds = time.perf_counter() - start
  samples = np.asarray(jax.jit(sample_images, static_argnums=(0, 3))(
      model, params, sample_key, config.num_samples))

  results = {
      "config": dataclasses.asdict(config),
      "bits_per_dim_base": "log2 probability per pixel, 17 grey levels 0..16",
      "test_bits_per_dim": bits_per_dim(float(evaluate(params, test_j))),
      "train_bits_per_dim": bits_per_dim(float(evaluate(params, train_j))),
      "uniform_bits_per_dim": math.log2(LEVELS),
      "pixel_histogram_test_bits_per_dim": histogram_bits_per_dim(train, test),
      "train_seconds": train_seconds,
      "sample_mean_grey": float(samples.mean()),
      "test_mean_grey": float(test.mean()),
      "sample_fraction_zero": float((samples == 0).mean()),
      "test_fraction_zero": float((test == 0).mean()),
      "samples_are_levels": bool(np.all(samples == np.round(samples))
                                 and samples.min() >= 0 and samples.max() <= LEVELS - 1),
      "bits_per_dim_curve_step_train_batch_test": curve,
  }
  os.makedirs(output_dir, exist_ok=True)
  _plot(test[:config.num_samples], samples, curve, results,
        os.path.join(output_dir, "pixel_mixture.png"))
  with open(os.path.join(output_dir, "pixel_mixture.json"), "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def _grid(images: np.ndarray, columns: int = 8) -> np.ndarray:
  rows = math.ceil(len(images) / columns)
  canvas = np.full((rows * 9 + 1, columns * 9 + 1), np.nan)
  for i, image in enumerate(images):
    r, c = divmod(i, columns)
    canvas[1 + 9 * r:9 + 9 * r, 1 + 9 * c:9 + 9 * c] = image.reshape(8, 8)
  return canvas


def _plot(test: np.ndarray, samples: np.ndarray, curve, results, path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
  for ax, images, title in ((axes[0], test, "test digits"),
                            (axes[1], samples, "samples, drawn pixel by pixel")):
    ax.imshow(_grid(images), cmap="gray_r", vmin=0, vmax=LEVELS - 1)
    ax.set_title(title)
    ax.axis("off")
  steps, train_bits, test_bits = zip(*curve)
  axes[2].plot(steps, train_bits, label="train batch", lw=0.8)
  axes[2].plot(steps, test_bits, label="test", lw=0.8)
  for key, label, color, style in (
      ("test_bits_per_dim", "test (model)", "C1", "--"),
      ("pixel_histogram_test_bits_per_dim", "test (pixel histograms)", "C2", ":"),
      ("uniform_bits_per_dim", "uniform, log2(17)", "k", "-.")):
    axes[2].axhline(results[key], color=color, linestyle=style,
                    label=f"{label}: {results[key]:.2f}")
  axes[2].set_xlabel("step")
  axes[2].set_ylabel("bits / pixel (17 levels)")
  axes[2].set_ylim(0, 4.5)
  axes[2].legend()
  fig.suptitle("Autoregressive discretized logistic mixture (MADE) on 8x8 digits")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  defaults = PixelMixtureConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/pixel_mixture")
  parser.add_argument("--num_components", type=int, default=defaults.num_components)
  parser.add_argument("--hidden", type=int, nargs="+", default=list(defaults.hidden))
  parser.add_argument("--steps", type=int, default=defaults.steps)
  parser.add_argument("--batch_size", type=int, default=defaults.batch_size)
  parser.add_argument("--learning_rate", type=float, default=defaults.learning_rate)
  parser.add_argument("--weight_decay", type=float, default=defaults.weight_decay)
  parser.add_argument("--num_samples", type=int, default=defaults.num_samples)
  parser.add_argument("--test_fraction", type=float, default=defaults.test_fraction)
  parser.add_argument("--seed", type=int, default=defaults.seed)
  args = parser.parse_args(argv)
  config = PixelMixtureConfig(num_components=args.num_components, hidden=tuple(args.hidden),
                              steps=args.steps, batch_size=args.batch_size,
                              learning_rate=args.learning_rate,
                              weight_decay=args.weight_decay, num_samples=args.num_samples,
                              test_fraction=args.test_fraction, seed=args.seed)
  results = run(config, args.output_dir)
  print(strict_json.dumps({k: v for k, v in results.items()
                          if k != "bits_per_dim_curve_step_train_batch_test"},
                         null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
