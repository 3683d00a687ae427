"""tools/step_profile.py and its library (meshbayes.scaling.step_operations, peak_buffers):
the compiled program's operations by kind, a profile's times, and the peak's buffers."""

import json

import jax
import jax.numpy as jnp
import pytest

from meshbayes import layers
from meshbayes.scaling import hlo, peak_buffers, step_operations
from meshbayes.scaling.step_spec import step_spec
from meshbayes.tools import step_profile
from tests.layers.fixtures import storing_noise


def bayesian_layer_gradient():
  layer = layers.DenseFlipout(features=64)
  x = jax.random.normal(jax.random.key(0), (32, 64))
  params = layer.init(jax.random.key(0), x)["params"]

  def loss(params, key):
    y, state = layer.apply({"params": params}, x, rngs={"sample": key},
                           mutable=[layers.KL_COLLECTION])
    return jnp.sum(jnp.tanh(y)) + layers.total_kl(state)

  compiled = jax.jit(jax.grad(loss)).lower(params, jax.random.key(1)).compile()
  return compiled, lambda: compiled(params, jax.random.key(1))


def test_operations_have_kinds_and_add_up_to_the_programs_flops():
  compiled, run = bayesian_layer_gradient()
  text = compiled.as_text()
  ops = step_operations.operations(text)
  table = step_operations.by_kind(ops)
  assert {"matmul", "noise", "kl"} <= {kind for kind, row in table.items() if row["operations"]}
  # hlo.analyze skips the small computations that ``call`` runs (key splitting); here counted.
  assert sum(row["flops"] for row in table.values()) == pytest.approx(
      hlo.analyze(text).flops, rel=0.01)
  assert table["matmul"]["flops"] == pytest.approx(hlo.analyze(text).matmul_flops)
  seconds = step_operations.profile(run, steps=2, module=None)
  assert set(step_operations.by_kind(ops, seconds)) == set(step_operations.KINDS) | {
      "matmul_async_wait"}
  assert sum(seconds.values()) > 0


def test_kinds_come_from_the_innermost_functions_named():
  frames = lambda *functions: tuple(("/x/meshbayes/layers/m.py", f) for f in functions)
  assert step_operations.kind_of_frames(frames("threefry2x32", "flipout")) == "noise"
  assert step_operations.kind_of_frames(frames("all_finite.<locals>.<listcomp>")) == "checks"
  assert step_operations.kind_of_frames(frames("_Linear.__call__")) is None
  optax = (("/v/site-packages/optax/_src/transform.py", "scale_by_adam.<locals>.update_fn"),
           ("/v/site-packages/optax/transforms/_combining.py", "chain.<locals>.update_fn"))
  assert step_operations.kind_of_frames(optax) == "optimizer"
  # The clipping by the global norm over stacked layers (training.multi_tensor) is the
  # optimizer's, though not optax's code.
  clip = (("/x/meshbayes/training/multi_tensor.py", "clip_by_global_norm.<locals>.update_fn"),)
  assert step_operations.kind_of_frames(clip) == "optimizer"


@pytest.mark.integration
@pytest.mark.slow  # six train steps compiled and profiled: two minutes on 2 cores
def test_the_tool_reports_each_program_by_kind_and_the_ablations_times(tmp_path, capsys):
  out = tmp_path / "profile.json"
  report = step_profile.main(["--model=tiny", "--batch=2", "--length=8", "--profile_steps=1",
                              "--rounds=1", "--ablations", "--top=3", f"--json={out}"])
  assert json.loads(out.read_text()) == json.loads(json.dumps(report))
  assert set(report["seconds"]) == {"deterministic", "bayesian", "constant_noise", "no_kl", "sgd",
                                    "deterministic_sgd"}
  deterministic, bayesian = report["deterministic"]["by_kind"], report["bayesian"]["by_kind"]
  # What only a Bayesian step has: noise and a KL; both do matmuls and an optimizer update.
  assert deterministic["noise"]["operations"] == deterministic["kl"]["operations"] == 0
  assert bayesian["noise"]["operations"] > 0 and bayesian["kl"]["operations"] > 0
  assert bayesian["matmul"]["flops"] > deterministic["matmul"]["flops"] > 0
  assert bayesian["optimizer"]["bytes"] > deterministic["optimizer"]["bytes"] > 0
  assert len(report["bayesian"]["top"]) == 3
  table = capsys.readouterr().out
  assert "| noise |" in table and "| constant_noise |" in table


@pytest.mark.integration
@pytest.mark.slow  # three train steps compiled without the compilation cache: about a minute
def test_the_peak_buffers_by_kind_show_stored_noise_and_its_regeneration(tmp_path, capsys):
  """The tiny preset's steps, compiled: the kinds add up to the live-range peak; the
  deterministic step holds no noise; the Bayesian step's stored noise is at its peak and
  regenerating takes it off (what docs/results/2026-11-noise-regenerated.md measures at full size)."""
  args = ["--sections=buffers", "--model=tiny", "--batch=8", "--length=16", "--top=3"]
  regenerated = step_profile.main([*args, f"--json={tmp_path / 'r.json'}"])["buffers"]
  with storing_noise():  # the deterministic step would be the same again: not compiled
    stored = peak_buffers.buffer_report(step_spec("tiny", 8, 16, deterministic=False), top=3)
  assert "| noise |" in capsys.readouterr().out
  for report in (regenerated["deterministic"], regenerated["bayesian"], stored):
    assert sum(k["bytes"] for k in report["by_kind"].values()) == report["peak_bytes"]
    assert report["by_kind"]["parameters"]["bytes"] > 0
    assert report["by_kind"]["optimizer state"]["bytes"] > 0
  det = regenerated["deterministic"]["by_kind"]
  assert det["noise"]["bytes"] == det["estimator"]["bytes"] == 0
  # Adam's two moments of every parameter.
  bayes = regenerated["bayesian"]["by_kind"]
  assert bayes["optimizer state"]["bytes"] >= 2 * bayes["parameters"]["bytes"]
  noise = lambda r: r["by_kind"]["noise"]["bytes"] + r["by_kind"]["estimator"]["bytes"]
  assert noise(stored) > 4 * max(noise(regenerated["bayesian"]), 1)
  assert stored["temp_bytes"] > regenerated["bayesian"]["temp_bytes"]
  assert json.loads((tmp_path / "r.json").read_text())["buffers"]["bayesian"]["temp_bytes"] > 0
