"""A small Bayesian network trained on CPU in seconds: the layer library end to end.

A 3-layer MLP (Flipout, local reparameterization, Flipout) learns a noisy 4-class
problem labelled by a random teacher network, by the per-example negative ELBO;
then the posterior mean is compared with the Monte Carlo predictive, and the mutual
information shown to grow off the training distribution.
Run: ``python -m meshbayes.demo [--steps N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax

from meshbayes import predictive
from meshbayes.field_checks import positive_ints
from meshbayes.layers import KL_COLLECTION, kl_penalty, total_kl
from meshbayes.models import MLP

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class DemoConfig:
  """Settings of the demo run."""

  steps: int = 1000
  batch_size: int = 128
  num_train: int = 8192
  num_test: int = 1024
  input_dim: int = 8
  hidden: int = 64
  num_classes: int = 4
  label_noise: float = 0.25
  learning_rate: float = 1e-2
  num_samples: int = 32
  log_every: int = 100
  seed: int = 0

  def __post_init__(self):
    positive_ints("DemoConfig", self, "steps", "batch_size", "num_train", "num_test",
                  "num_samples", "log_every")
    if self.batch_size > self.num_train:
      raise ValueError(f"DemoConfig: batch_size={self.batch_size} must be <= "
                       f"num_train={self.num_train}")


def make_data(key: Array, config: DemoConfig) -> tuple[Array, Array, Array, Array, Array]:
  """Inputs ``N(0, I)``, labels from a random teacher with Gumbel label noise.

  Returns:
    Train inputs and labels, test inputs and labels, and the teacher's own
    noiseless predictions on the test inputs (the Bayes-optimal classifier).
  """
  k_w1, k_w2, k_x, k_noise = jax.random.split(key, 4)
  w1 = jax.random.normal(k_w1, (config.input_dim, 32)) / jnp.sqrt(config.input_dim)
  w2 = jax.random.normal(k_w2, (32, config.num_classes)) * 2.0 / jnp.sqrt(32)
  n = config.num_train + config.num_test
  x = jax.random.normal(k_x, (n, config.input_dim))
  logits = jnp.tanh(x @ w1) @ w2
  y = jnp.argmax(logits + config.label_noise * jax.random.gumbel(k_noise, logits.shape), -1)
  n_tr = config.num_train
  return x[:n_tr], y[:n_tr], x[n_tr:], y[n_tr:], jnp.argmax(logits[n_tr:], -1)


def nll(logits: Array, labels: Array) -> Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def run(config: DemoConfig) -> list[dict[str, float]]:
  """Trains and evaluates; prints a log and returns the logged rows."""
  key_data, key_init, key_train, key_eval = jax.random.split(jax.random.key(config.seed), 4)
  x_train, y_train, x_test, y_test, y_teacher = make_data(key_data, config)
  model = MLP(hidden_dims=(config.hidden, config.hidden), num_classes=config.num_classes,
              estimators=("flipout", "local_reparameterization", "flipout"))
  params = model.init(key_init, x_train[:1])["params"]
  optimizer = optax.adam(config.learning_rate)
  opt_state = optimizer.init(params)

  def loss_fn(params, x, y, key):
    logits, state = model.apply({"params": params}, x, rngs={"sample": key},
                                mutable=[KL_COLLECTION])
    kl = total_kl(state)
    batch_nll = nll(logits, y)
    loss = batch_nll + kl_penalty(kl, config.num_train)
    return loss, {"loss": loss, "nll": batch_nll, "kl": kl,
                  "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}

  @jax.jit
  def train_step(params, opt_state, step):
    key = jax.random.fold_in(key_train, step)
    key_batch, key_sample = jax.random.split(key)
    idx = jax.random.choice(key_batch, config.num_train, (config.batch_size,), replace=False)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(params, x_train[idx], y_train[idx],
                                                     key_sample)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics

  print(f"meshbayes demo: {sum(p.size for p in jax.tree.leaves(params)):,} variational "
        f"parameters, {config.num_train} training examples, ELBO = NLL + KL / "
        f"{config.num_train}")
  print(f"{'step':>6} {'loss':>8} {'nll':>8} {'kl (nats)':>11} {'kl/N':>8} {'acc':>6}")
  rows = []
  start = time.perf_counter()
  for step in range(1, config.steps + 1):
    params, opt_state, metrics = train_step(params, opt_state, step)
    if step == 1 or step % config.log_every == 0:
      row = {k: float(v) for k, v in metrics.items()} | {"step": step}
      rows.append(row)
      print(f"{step:>6} {row['loss']:>8.4f} {row['nll']:>8.4f} {row['kl']:>11.1f} "
            f"{row['kl'] / config.num_train:>8.4f} {row['accuracy']:>6.3f}")
  print(f"trained {config.steps} steps in {time.perf_counter() - start:.1f} s")

  def sample_log_probs(x):
    apply = lambda k: jax.nn.log_softmax(model.apply({"params": params}, x, rngs={"sample": k}))
    return predictive.sample_outputs(apply, key_eval, config.num_samples)

  mean_log_probs = jax.nn.log_softmax(model.apply({"params": params}, x_test, deterministic=True))
  bma_log_probs = predictive.model_average(sample_log_probs(x_test))
  for name, log_probs in (("posterior mean", mean_log_probs),
                          (f"MC average, S={config.num_samples}", bma_log_probs)):
    accuracy = jnp.mean(jnp.argmax(log_probs, -1) == y_test)
    test_nll = -jnp.mean(jnp.take_along_axis(log_probs, y_test[:, None], -1))
    print(f"test {name:>20}: accuracy {float(accuracy):.3f}, NLL {float(test_nll):.4f}")
  print(f"(the noiseless teacher scores {float(jnp.mean(y_teacher == y_test)):.3f} on the "
        "noisy test labels)")
  mi_in = predictive.mutual_information(sample_log_probs(x_test)).mean()
  mi_out = predictive.mutual_information(sample_log_probs(4.0 * x_test)).mean()
  print(f"epistemic uncertainty (mutual information, nats): test inputs {float(mi_in):.4f}, "
        f"inputs scaled x4 (off-distribution) {float(mi_out):.4f}")
  return rows


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=DemoConfig.steps)
  parser.add_argument("--seed", type=int, default=DemoConfig.seed)
  args = parser.parse_args(argv)
  run(DemoConfig(steps=args.steps, seed=args.seed))


if __name__ == "__main__":
  main()
