"""Learning-rate and KL-weight schedules, and what weight decay may touch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.training.optimizers import (
    KLWeight,
    LearningRate,
    Optimizer,
    decay_mask,
    posterior_scale_mask,
)


def test_learning_rate_schedules():
  rsqrt = LearningRate("rsqrt", base=1e-2, warmup_steps=100)
  np.testing.assert_allclose([rsqrt(0), rsqrt(49), rsqrt(99), rsqrt(399)],
                             [1e-4, 5e-3, 1e-2, 5e-3], rtol=1e-5)
  constant = LearningRate("constant", base=1e-3, warmup_steps=0)
  assert float(constant(0)) == float(constant(10_000)) == pytest.approx(1e-3)
  cosine = LearningRate("cosine", base=1e-3, warmup_steps=10, decay_steps=110, end_value=1e-5)
  np.testing.assert_allclose([cosine(10), cosine(110)], [1e-3, 1e-5], rtol=1e-4)


def test_kl_weight_annealing():
  linear = KLWeight("linear", value=1.0, start_value=0.0, warmup_steps=100)
  np.testing.assert_allclose([linear(0), linear(50), linear(100), linear(1000)], [0, 0.5, 1, 1])
  assert float(KLWeight(value=0.3)(12345)) == pytest.approx(0.3)


def test_weight_decay_never_touches_posterior_scales_or_priors():
  params = {"dense": {"kernel_loc": jnp.ones(2), "kernel_scale": jnp.full(2, -5.0),
                      "kernel_prior_scale": jnp.ones(()), "bias": jnp.ones(2)}}
  assert decay_mask(params) == {"dense": {"kernel_loc": True, "kernel_scale": False,
                                          "kernel_prior_scale": False, "bias": True}}
  tx = Optimizer("adamw", LearningRate("constant", 0.1, 0), weight_decay=0.5,
                 clip_gradient_norm=0).transformation()
  zero_grads = {"dense": {k: jnp.zeros_like(v) for k, v in params["dense"].items()}}
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  assert float(jnp.abs(updates["dense"]["kernel_scale"]).max()) == 0.0
  assert float(jnp.abs(updates["dense"]["kernel_loc"]).max()) > 0


@pytest.mark.parametrize("name", ["adamw", "sgd", "adafactor"])
def test_posterior_scales_step_scale_lr_multiplier_times_the_others(name):
  params = {"dense": {"kernel_loc": jnp.ones(3), "kernel_scale": jnp.full(3, -5.0),
                      "kernel_prior_scale": jnp.ones(()), "bias": jnp.ones(3)},
            "norm": {"scale": jnp.ones(3)}}
  assert posterior_scale_mask(params) == {
      "dense": {"kernel_loc": False, "kernel_scale": True, "kernel_prior_scale": False,
                "bias": False}, "norm": {"scale": False}}
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
  updates = {}
  for multiplier in (1.0, 7.0):
    tx = Optimizer(name, LearningRate("constant", 0.01, 0), clip_gradient_norm=0,
                   scale_lr_multiplier=multiplier).transformation()
    updates[multiplier] = tx.update(grads, tx.init(params), params)[0]
  for path, ratio in ((("dense", "kernel_scale"), 7.0), (("dense", "kernel_loc"), 1.0),
                      (("dense", "kernel_prior_scale"), 1.0), (("norm", "scale"), 1.0)):
    np.testing.assert_allclose(updates[7.0][path[0]][path[1]],
                               ratio * updates[1.0][path[0]][path[1]], rtol=1e-6)
  assert float(jnp.abs(updates[1.0]["dense"]["kernel_scale"]).max()) > 0


@pytest.mark.parametrize("make, match", [
    (lambda: LearningRate("linear"), r"schedule='linear' must be one of"),
    (lambda: LearningRate("cosine", decay_steps=None), r"cosine needs decay_steps > warmup_steps"),
    (lambda: Optimizer("lamb"), r"name='lamb' must be one of"),
    (lambda: Optimizer(scale_lr_multiplier=0), r"scale_lr_multiplier=0 must be > 0"),
    (lambda: KLWeight("linear", warmup_steps=0), r"linear annealing needs warmup_steps >= 1"),
])
def test_schedule_errors(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_adafactor_state_is_factored():
  tx = Optimizer("adafactor", LearningRate("constant", 1e-3, 0)).transformation()
  state = tx.init({"w": jnp.ones((256, 512))})
  shapes = {tuple(x.shape) for x in jax.tree.leaves(state)}
  assert (256,) in shapes and (512,) in shapes  # row and column statistics, no full matrix
  assert (256, 512) not in shapes
