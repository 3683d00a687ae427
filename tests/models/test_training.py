"""The tiny Transformer learns a synthetic reverse task on CPU, deterministic and Bayesian.

Run with -s to see the loss curves and training times.
"""

import functools
import time

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import Estimators, TransformerConfig
from tests.models.synthetic import make_batch

TINY = TransformerConfig(vocab_size=32, emb_dim=32, num_heads=2, head_dim=16,
                         num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64, dropout_rate=0.0)


def train(estimators, steps=700, batch_size=64, length=10, log_every=100):
  """Adam (warm-up, cosine decay, clipping) on fresh random batches.

  Returns:
    The training NLL curve, posterior-mean metrics on a held-out batch, seconds.
  """
  model = EncoderDecoderModel(TINY.replace(estimators=estimators), num_train_units=1e6)
  rng = np.random.default_rng(0)
  shapes = {k: v.shape for k, v in make_batch(rng, batch_size, length, 32).items()}
  params = jax.jit(lambda k: nn.unbox(model.get_initial_variables(k, shapes)["params"]))(
      jax.random.key(0))
  schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, warmup_steps=50, decay_steps=steps)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
  opt_state = optimizer.init(params)

  # Optimized code for this long loop (the suite compiles unoptimized: tests/conftest.py).
  @functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 2})
  def step(params, opt_state, batch, i):
    grads, metrics = jax.grad(model.loss_fn, has_aux=True)(params, batch,
                                                           jax.random.fold_in(jax.random.key(1), i))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics

  curve, start = [], time.perf_counter()
  for i in range(steps):
    params, opt_state, metrics = step(params, opt_state, make_batch(rng, batch_size, length, 32),
                                      i)
    if i % log_every == 0 or i == steps - 1:
      curve.append((i, float(metrics["nll"])))
  seconds = time.perf_counter() - start
  held_out = make_batch(np.random.default_rng(123), 256, length, 32)
  _, eval_metrics = jax.jit(model.eval_fn)(params, held_out)
  return curve, {k: float(v) for k, v in eval_metrics.items()}, seconds


@pytest.mark.parametrize("name, estimators", [
    pytest.param("deterministic", Estimators.deterministic(), marks=pytest.mark.slow),
    # Slow too: make test trains the Bayesian Transformer in test_demo and the experiment.
    pytest.param("bayesian", Estimators(), marks=pytest.mark.slow)])
def test_tiny_transformer_learns_to_reverse(name, estimators):
  curve, metrics, seconds = train(estimators)
  print(f"{name}: NLL by step {curve}; held-out posterior-mean NLL {metrics['nll']:.4f}, "
        f"accuracy {metrics['accuracy']:.4f}, KL {metrics['kl']:.0f}; {seconds:.1f} s")
  assert curve[0][1] > 3.0  # log(32) = 3.47 at the start
  assert metrics["nll"] < 0.05 and metrics["accuracy"] > 0.99
