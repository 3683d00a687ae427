"""A small VQ-VAE (van den Oord et al., 2017) on scikit-learn's digits.

A convolutional encoder to a 4x4 grid of codes through a ``VectorQuantizer``
(EMA codebook, or ``--no-ema``) and a decoder; scored by test reconstruction
MSE and codebook usage. docs/examples.md.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from meshbayes.examples.lenet_digits import load_digits_split
from meshbayes.layers.vector_quantization import (
    CODES_NAME,
    VQ_LOSS_COLLECTION,
    VQ_STATS_COLLECTION,
    VectorQuantizer,
    code_usage,
    total_vq_loss,
)
from meshbayes.runtime import strict_json

Array = jax.Array


class VQVAE(nn.Module):
  """Conv encoder to a 4x4 grid, ``VectorQuantizer``, conv decoder back to 8x8 pixels.

  >>> model = VQVAE(num_embeddings=8, embedding_dim=4, hidden=8)
  >>> x = jnp.zeros((2, 8, 8, 1))
  >>> def forward(x):  # shapes only (eval_shape): compiling the initializers takes seconds
  ...   return model.apply(model.init(jax.random.key(0), x), x, mutable=['intermediates'])
  >>> y, state = jax.eval_shape(forward, x)
  >>> y.shape, state['intermediates']['quantizer']['codes'][0].shape
  ((2, 8, 8, 1), (2, 4, 4))
  """

  num_embeddings: int = 32
  embedding_dim: int = 16
  hidden: int = 32
  ema: bool = True
  commitment_cost: float = 0.25

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = False) -> Array:
    h = nn.relu(nn.Conv(self.hidden, (3, 3))(x))
    h = nn.relu(nn.Conv(self.hidden, (3, 3), strides=2)(h))
    z = nn.Conv(self.embedding_dim, (1, 1))(h)
    q = VectorQuantizer(self.num_embeddings, commitment_cost=self.commitment_cost,
                        ema=self.ema, name="quantizer")(z, deterministic=deterministic)
    h = nn.relu(nn.Conv(self.hidden, (3, 3))(q))
    h = nn.relu(nn.ConvTranspose(self.hidden, (3, 3), strides=(2, 2))(h))
    return nn.sigmoid(nn.Conv(1, (3, 3))(h))


def train(model: VQVAE, x_train: np.ndarray, steps: int, batch_size: int, learning_rate: float,
          seed: int) -> tuple[dict, list[float], float]:
  """Adam on MSE + VQ losses; returns the variables, the loss every 100 steps and the seconds."""
  key = jax.random.key(seed)
  variables = nn.unbox(model.init(key, jnp.asarray(x_train[:batch_size])))
  params = variables["params"]
  stats = {k: v for k, v in variables.items() if k != "params"}
  optimizer = optax.adam(learning_rate)
  opt_state = optimizer.init(params)

  def loss_fn(params, stats, x):
    y, state = model.apply({"params": params, **stats}, x,
                           mutable=[VQ_LOSS_COLLECTION, VQ_STATS_COLLECTION])
    loss = jnp.mean((y - x) ** 2) + total_vq_loss(state)
    return loss, {k: v for k, v in state.items() if k == VQ_STATS_COLLECTION}

  @jax.jit
  def step(params, stats, opt_state, x):
    (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), {**stats, **new_stats}, opt_state, loss

  rng = np.random.default_rng(seed)
  losses = []
  start = time.perf_counter()
  for i in range(steps):
    batch = jnp.asarray(x_train[rng.choice(len(x_train), batch_size, replace=False)])
    params, stats, opt_state, loss = step(params, stats, opt_state, batch)
    if i % 100 == 0 or i == steps - 1:
      losses.append(float(loss))
  jax.block_until_ready(params)
  return {"params": params, **stats}, losses, time.perf_counter() - start


def evaluate(model: VQVAE, variables: dict, x_test: np.ndarray, train_mean: np.ndarray
             ) -> tuple[dict[str, object], np.ndarray, np.ndarray]:
  """Test reconstruction MSE and code usage; also returns the reconstructions and counts."""
  recon, state = model.apply(variables, jnp.asarray(x_test), deterministic=True,
                             mutable=["intermediates"])
  codes = state["intermediates"]["quantizer"][CODES_NAME][0]
  counts, perplexity = code_usage(codes, model.num_embeddings)
  recon = np.asarray(recon)
  metrics = {
      "test_mse": float(np.mean((recon - x_test) ** 2)),
      "test_mse_train_mean_image": float(np.mean((train_mean - x_test) ** 2)),
      "codebook_entries_used": int(np.sum(np.asarray(counts) > 0)),
      "codebook_size": model.num_embeddings,
      "codes_per_image": int(np.prod(codes.shape[1:])),
      "perplexity": float(perplexity),
  }
  return metrics, recon, np.asarray(counts)


def run(output_dir: str, steps: int = 3000, num_embeddings: int = 32, embedding_dim: int = 16,
        hidden: int = 32, ema: bool = True, batch_size: int = 64, learning_rate: float = 2e-3,
        seed: int = 0) -> dict[str, object]:
  """Trains the VQ-VAE, evaluates it, writes the figure and the JSON; returns the numbers."""
  x_train, _, x_test, _ = load_digits_split(seed=seed)
  model = VQVAE(num_embeddings=num_embeddings, embedding_dim=embedding_dim, hidden=hidden,
                ema=ema)
  variables, losses, seconds = train(model, x_train, steps, batch_size, learning_rate, seed)
  metrics, recon, counts = evaluate(model, variables, x_test, x_train.mean(axis=0))
  results = {
      "config": {"steps": steps, "num_embeddings": num_embeddings,
                 "embedding_dim": embedding_dim, "hidden": hidden, "ema": ema,
                 "batch_size": batch_size, "learning_rate": learning_rate, "seed": seed},
      **metrics,
      "code_counts": counts.tolist(),
      "train_loss_every_100_steps": losses,
      "train_seconds": seconds,
  }
  os.makedirs(output_dir, exist_ok=True)
  plot(os.path.join(output_dir, "vqvae_digits.png"), x_test, recon, counts, metrics)
  with open(os.path.join(output_dir, "vqvae_digits.json"), "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def plot(path: str, x_test: np.ndarray, recon: np.ndarray, counts: np.ndarray,
         metrics: dict[str, object], num_shown: int = 12) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig = plt.figure(figsize=(13, 3.2))
  grid = fig.add_gridspec(2, num_shown + 7, wspace=0.1, top=0.82, bottom=0.17, left=0.04, right=0.98)
  for i in range(num_shown):
    for row, images in enumerate((x_test, recon)):
      ax = fig.add_subplot(grid[row, i])
      ax.imshow(images[i, ..., 0], cmap="gray_r", vmin=0, vmax=1)
      ax.set_xticks([])
      ax.set_yticks([])
      if i == 0:
        ax.set_ylabel(("test digit", "reconstruction")[row])
  ax = fig.add_subplot(grid[:, num_shown + 2:])
  ax.bar(np.arange(len(counts)), counts / max(counts.sum(), 1))
  ax.set_xlabel("codebook entry")
  ax.set_ylabel("frequency on test codes")
  ax.set_title(f"{metrics['codebook_entries_used']}/{metrics['codebook_size']} used, "
               f"perplexity {metrics['perplexity']:.1f}")
  fig.suptitle(f"VQ-VAE on digits: {metrics['codes_per_image']} codes per image, test MSE "
               f"{metrics['test_mse']:.4f} (mean image {metrics['test_mse_train_mean_image']:.4f})")
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/vqvae_digits")
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--num_embeddings", type=int, default=32)
  parser.add_argument("--embedding_dim", type=int, default=16)
  parser.add_argument("--hidden", type=int, default=32)
  parser.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--learning_rate", type=float, default=2e-3)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  results = run(**vars(args))
  summary = {k: v for k, v in results.items()
             if k not in ("code_counts", "train_loss_every_100_steps")}
  print(strict_json.dumps(summary, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
