"""The cost of being Bayesian in compiled programs: train steps, Dense layers and decoding.

Every figure compares programs timed in the same process, alternating round
after round (``timing.alternate``), each side's time its fastest round, the
medians reported too (docs/performance.md says how they are measured):

- ``step_ratios``: the trainer's train step of one preset, deterministic vs
  Bayesian (AdamW) and IVON vs AdamW: time ratios, compiled FLOP ratios
  (``meshbayes.scaling.hlo``) and their quotient, the efficiency quotient; with
  IVON's and the noise's ablations (``meshbayes.scaling.ablations``) when asked.
- ``gpu_step_prediction``: the same two steps compiled for a GPU without one:
  the frozen step-time model v1's seconds, TFLOP/s and MFU of each
  (``roofline.FROZEN_GPU_MODEL``) and v2's beside them (``FROZEN_GPU_MODEL_V2``,
  provisional: cuDNN's fused attention at its measured rate), with their kernels, HBM
  bytes, kernels of avoidable work and XLA's memory analysis.
- ``layer_ratios``: forward + backward of one Dense layer per estimator against
  the deterministic one, with its ``floor`` (matmul FLOP ratio plus the noise
  drawn alone), per PRNG implementation.
- ``decode_rates`` and ``decode_memory``: decoding with the posterior mean
  against model averaging over S weight samples, and the compiled decode's
  memory per S.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from meshbayes import layers
from meshbayes.layers import estimators
from meshbayes.scaling import aot, hlo, peaks, roofline
from meshbayes.scaling.ablations import IVON_ABLATIONS, NOISE_ABLATIONS, jax_random_noise
from meshbayes.scaling.step_spec import (compiled_train_step, one_device_partitioner,
                                         random_batch, step_spec, traced_step_flops)
from meshbayes.scaling.timing import alternate, paired_time_ratio


# --- the trainer's train step, deterministic vs Bayesian ---------------------------------------

def step_ratios(model: str, batch_size: int, length: int, rounds: int, *,
                dtype: str | None = None, remat_policy: str | None = None,
                overrides: Sequence[tuple[str, Any]] = (), ivon_ablations: bool = False,
                noise_ablations: bool = False) -> dict[str, Any]:
  """Seconds and FLOPs of preset ``model``'s step on one device, deterministic, Bayesian and
  IVON (and the ablations asked for), timed alternating ``rounds`` rounds, and their ratios."""
  partitioner = one_device_partitioner()
  programs, flops, states = {}, {}, {}
  rng = np.random.default_rng(0)
  # (deterministic model, optimizer): the baseline, Bayesian layers, and IVON's posterior
  # learned by the optimizer on the deterministic model.
  kinds = {"deterministic": (True, "adamw"), "bayesian": (False, "adamw"),
           "ivon": (True, "ivon")}
  if ivon_ablations:
    kinds.update({name: (True, "ivon") for name in IVON_ABLATIONS})
  if noise_ablations:
    kinds.update({name: (False, "adamw") for name in NOISE_ABLATIONS})
  ablations = {**IVON_ABLATIONS, **NOISE_ABLATIONS}
  for kind, (deterministic, optimizer) in kinds.items():
    spec = step_spec(model, batch_size, length, deterministic, optimizer, dtype=dtype,
                     remat_policy=remat_policy, overrides=overrides)
    batch = random_batch(spec, rng)
    with ablations.get(kind, contextlib.nullcontext)():
      states[kind], compiled = compiled_train_step(spec, partitioner, batch)
      traced = traced_step_flops(spec, partitioner, batch)
    summary = hlo.analyze(compiled.as_text())
    # traced: the model's matmuls as written (the same on every platform); matmul and all:
    # what the compiled program does (recomputation, the platform's own lowering).
    flops[kind] = {"traced_matmul": traced, "matmul": summary.matmul_flops,
                   "all": summary.flops}

    def run(name=kind, fn=compiled, data=batch):
      states[name], metrics = fn(states[name], data)  # the old state is donated
      return metrics["loss"]

    programs[kind] = run
  rounds_seconds: dict[str, list[float]] = {}
  times, medians = alternate(programs, rounds, warmup=1, record=rounds_seconds)
  time_ratio = times["bayesian"] / times["deterministic"]
  ratio = lambda count: flops["bayesian"][count] / flops["deterministic"][count]
  device = jax.devices()[0]  # the one device the step ran on: traced FLOPs are its own
  return {"model": model, "batch_size": batch_size, "length": length,
          "seconds": times, "median_seconds": medians, "flops": flops, "time_ratio": time_ratio,
          # Ratios and MFU from the traced FLOPs; the compiled programs' counts beside them.
          "flop_ratio": ratio("traced_matmul"),
          "efficiency_quotient": time_ratio / ratio("traced_matmul"),
          "hlo_matmul_flop_ratio": ratio("matmul"), "hlo_flop_ratio": ratio("all"),
          "hlo_efficiency_quotient": time_ratio / ratio("all"),
          **peaks.utilization({name: f["traced_matmul"] for name, f in flops.items()}, times,
                              device.device_kind, device.platform),
          "ivon_time_ratio": times["ivon"] / times["deterministic"],
          # IVON adds no matmul: its extra work is elementwise, counted in the compiled program.
          "ivon_flop_ratio": flops["ivon"]["all"] / flops["deterministic"]["all"],
          **{f"{name}_time_ratio": times[name] / times["deterministic"]
             for name in IVON_ABLATIONS if name in times},
          # Regenerated over stored noise (goal: at most 1.03,
          # docs/results/2026-11-noise-regenerated.md), and
          # the same with the variance kept (the share of it its matmul takes).
          **({"regenerating_time_ratio": paired_time_ratio(rounds_seconds, "bayesian",
                                                           "bayesian_storing_noise"),
              "keeping_variance_time_ratio": paired_time_ratio(
                  rounds_seconds, "bayesian_keeping_variance", "bayesian_storing_noise")}
             if noise_ablations else {}),
          "goal": "efficiency_quotient <= 1.05, ivon_time_ratio <= 1.10"}


def gpu_step_prediction(target: Any, model: str, batch_size: int, length: int, *,
                        dtype: str | None = None, remat_policy: str | None = None,
                        overrides: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
  """The deterministic and Bayesian steps compiled for GPU ``target`` without one: the frozen
  model v1's figures of each and their ratios, and v2's beside them (the ``v2_`` fields:
  seconds, TFLOP/s, MFU and the fused-attention calls' seconds; v2 equals v1 on a step
  without cuDNN attention).

  Raises:
    RuntimeError: a step did not compile (the compiler's message).
  """
  programs = {}
  for kind, deterministic in (("deterministic", True), ("bayesian", False)):
    record = aot.compile_and_profile(step_spec(
        model, batch_size, length, deterministic, dtype=dtype, remat_policy=remat_policy,
        overrides=overrides), target)
    if record.get("error") or not record.get("roofline"):
      raise RuntimeError(f"--step_target={target.name}: the {kind} step did not compile: "
                         f"{record.get('error') or record.get('message')}")
    prediction = record["roofline"]["max"]
    v2 = roofline.predict(record, gpu_model=roofline.FROZEN_GPU_MODEL_V2)
    programs[kind] = {
        "seconds": prediction["step_seconds"],
        "tflops_per_second": prediction["tflops_per_second"], "mfu": prediction["mfu"],
        "matmul_seconds": prediction["compute_seconds"],
        "memory_seconds": prediction["memory_seconds"],
        "kernel_seconds": prediction["kernel_seconds"],
        "v2_seconds": v2.step_seconds, "v2_tflops_per_second": v2.tflops_per_second,
        "v2_mfu": v2.mfu, "v2_attention_seconds": v2.attention_seconds,
        "fused_attention_calls": sum(c["executed"]
                                     for c in record["fused_attention_per_device"]),
        "kernels": sum(op["executed"] for op in record["operations_per_device"].values()),
        "hbm_bytes": sum(op["bytes"] for op in record["operations_per_device"].values()),
        "avoidable_kernels": record["avoidable_kernels"],
        "model_flops": record["model_flops_per_device"],
        **{name: record[f"{name}_per_device"] for name in (
            "argument_bytes", "temp_bytes", "peak_bytes")},
        "fits": record["fits"], "compile_seconds": record["compile_seconds"]}
  det, bayes = programs["deterministic"], programs["bayesian"]
  time_ratio = bayes["seconds"] / det["seconds"]
  v2_time_ratio = bayes["v2_seconds"] / det["v2_seconds"]
  flop_ratio = bayes["model_flops"] / det["model_flops"]
  return {"target": target.name, "model": model, "batch_size": batch_size,
          "length": length, "dtype": dtype, "remat": remat_policy,
          "step_time_model": "roofline.FROZEN_GPU_MODEL",
          "v2_step_time_model": "roofline.FROZEN_GPU_MODEL_V2 (provisional)",
          "programs": programs, "time_ratio": time_ratio, "flop_ratio": flop_ratio,
          "efficiency_quotient": time_ratio / flop_ratio,
          # v2 adds the same attention time to both steps: the goals are judged on v1.
          "v2_time_ratio": v2_time_ratio, "v2_efficiency_quotient": v2_time_ratio / flop_ratio}


# --- layers: one Dense layer per estimator -------------------------------------------------------

def layer_program(estimator: str, rows: int, in_features: int, out_features: int,
                  impl: str | None) -> tuple[Callable[[], Any], float]:
  """Forward + backward of one Dense layer, and its compiled matmul FLOPs.

  The loss is ``sum(outputs) + KL``; the program returns its value and the
  gradients of every parameter. Returning the value keeps the forward pass:
  with gradients alone XLA would drop the deterministic layer's forward
  matmul (the loss is linear in the outputs), but not local
  reparameterization's variance matmul (the square root is not).
  """
  layer = layers.dense_class(estimator)(features=out_features)
  x = jax.random.normal(jax.random.key(1), (rows, in_features), jnp.float32)
  params = layer.init(jax.random.key(0), x)["params"]

  def loss(params, x, key):
    y, state = layer.apply({"params": params}, x, rngs={"sample": key},
                           mutable=[layers.KL_COLLECTION])
    return jnp.sum(y) + layers.total_kl(state)

  key = jax.random.key(2, impl=impl) if impl else jax.random.key(2)
  compiled = jax.jit(jax.value_and_grad(loss)).lower(params, x, key).compile()
  counter = iter(range(1 << 30))
  program = lambda: compiled(params, x, jax.random.fold_in(key, next(counter)))
  return program, hlo.analyze(compiled.as_text()).matmul_flops


# The noise each estimator draws per step for a Dense layer of (rows, in, out):
# the shapes of its normals and of its signs (the kernel's; a bias adds out more).
NOISE_SHAPES = {
    "reparameterization": lambda rows, d_in, d_out: ([(d_in, d_out)], []),
    "flipout": lambda rows, d_in, d_out: ([(d_in, d_out)], [(rows, d_in), (rows, d_out)]),
    "local_reparameterization": lambda rows, d_in, d_out: ([(rows, d_out)], []),
}


def noise_program(estimator: str, rows: int, in_features: int, out_features: int,
                  impl: str | None) -> Callable[[], Any]:
  """The estimator's draw alone, with the layers' samplers, summed so XLA keeps it."""
  normals, signs = NOISE_SHAPES[estimator](rows, in_features, out_features)

  def draw(key):
    keys = jax.random.split(key, len(normals) + len(signs))
    drawn = [estimators.standard_normal(k, shape) for k, shape in zip(keys, normals)]
    drawn += [estimators.rademacher(k, shape, jnp.float32)
              for k, shape in zip(keys[len(normals):], signs)]
    return sum(jnp.sum(x) for x in drawn)

  key = jax.random.key(3, impl=impl) if impl else jax.random.key(3)
  compiled = jax.jit(draw).lower(key).compile()
  counter = iter(range(1 << 30))
  return lambda: compiled(jax.random.fold_in(key, next(counter)))


def layer_ratios(rows: int, in_features: int, out_features: int, prng_impls: Sequence[str],
                 rounds: int, jax_noise: bool = True, stored_noise: bool = True
                 ) -> dict[str, Any]:
  """One Dense layer of ``(rows, in, out)`` per estimator against the deterministic one, per
  PRNG implementation of ``prng_impls`` ('default': jax's): time ratios, matmul FLOP
  ratios, the noise drawn alone and the floor; with jax.random's samplers and with the
  noise stored (not drawn again) beside each Bayesian layer when asked."""
  results: dict[str, Any] = {"rows": rows, "in_features": in_features,
                             "out_features": out_features, "dtype": "float32",
                             "goals": {"flipout": 2.1, "local_reparameterization": 2.1,
                                       "reparameterization": 1.1}}
  shapes = (rows, in_features, out_features)
  for impl in prng_impls:
    impl_arg = None if impl == "default" else impl
    programs, flops = {}, {}
    for estimator in layers.ESTIMATORS:
      programs[estimator], flops[estimator] = layer_program(estimator, *shapes, impl_arg)
      if jax_noise and estimator != "deterministic":
        with jax_random_noise():  # the same layer drawing its noise with jax.random
          name = f"{estimator} (jax.random noise)"
          programs[name], flops[name] = layer_program(estimator, *shapes, impl_arg)
      if stored_noise and estimator != "deterministic":
        with estimators.swapped(estimators.STORED):  # as written: noise kept, not redrawn
          name = f"{estimator} (noise stored)"
          programs[name], flops[name] = layer_program(estimator, *shapes, impl_arg)
    for estimator in NOISE_SHAPES:
      programs[f"{estimator} noise alone"] = noise_program(estimator, *shapes, impl_arg)
    times, medians = alternate(programs, rounds)
    noise = {n: times.pop(f"{n} noise alone") for n in NOISE_SHAPES}
    for n in NOISE_SHAPES:
      medians.pop(f"{n} noise alone")
    others = [name for name in times if name != "deterministic"]
    matmul_flop_ratio = {n: flops[n] / flops["deterministic"] for n in others}
    results[impl] = {
        "seconds": times, "median_seconds": medians,
        "ratio_to_deterministic": {n: times[n] / times["deterministic"] for n in others},
        # The matmul floor of each ratio, from the compiled programs.
        "matmul_flop_ratio": matmul_flop_ratio,
        # The extra matmuls at the deterministic layer's rate, plus the draw alone: what no
        # rewrite of the estimators' own elementwise work can go below on this machine.
        "noise_seconds": noise,
        "floor": {n: matmul_flop_ratio[n] + noise[n] / times["deterministic"]
                  for n in NOISE_SHAPES}}
  return results


# --- decoding: posterior mean vs Bayesian model averaging ----------------------------------------

def decode_rates(model_name: str, batch_size: int, length: int, method: str,
                 samples: Sequence[int], rounds: int) -> dict[str, Any]:
  """Sequences per second of preset ``model_name``'s decode with the posterior mean and with
  each number of weight samples of ``samples`` (stored and regenerated), alternating."""
  from meshbayes.models.configurables import preset_config
  from meshbayes.models.encoder_decoder import EncoderDecoderModel

  model = EncoderDecoderModel(preset_config(model_name), num_train_units=1e6)
  shape = (batch_size, length)
  shapes = {name: shape for name in ("encoder_input_tokens", "decoder_input_tokens",
                                     "decoder_target_tokens", "decoder_loss_weights")}
  params = nn.unbox(jax.jit(lambda k: model.get_initial_variables(k, shapes))(
      jax.random.key(0))["params"])
  vocab = model.config.vocab_size
  tokens = jax.random.randint(jax.random.key(1), shape, 2, vocab, jnp.int32)
  batch = {"encoder_input_tokens": tokens, "decoder_target_tokens": tokens}
  programs = {}
  for count in [0, *samples]:
    decode = jax.jit(functools.partial(model.predict_batch_with_aux, method=method,
                                       num_samples=count))
    programs[f"S={count}" if count else "posterior_mean"] = functools.partial(
        lambda d: d(params, batch, jax.random.key(3))[0], decode)
  for count in samples:
    decode = jax.jit(functools.partial(
        dataclasses.replace(model, decode_weights="regenerated").predict_batch_with_aux,
        method=method, num_samples=count))
    programs[f"S={count}, regenerated"] = functools.partial(
        lambda d: d(params, batch, jax.random.key(3))[0], decode)
  times, _ = alternate(programs, rounds)
  sequences = batch_size
  return {"model": model_name, "method": method, "batch_size": sequences,
          "max_length": length,
          "sequences_per_second": {k: sequences / t for k, t in times.items()},
          "slowdown_vs_posterior_mean": {k: t / times["posterior_mean"] for k, t in times.items()
                                         if k != "posterior_mean"}}


def decode_memory(model_name: str, batch_size: int, length: int, method: str,
                  samples: Sequence[int]) -> dict[str, Any]:
  """GiB of the compiled decode's arguments and temporaries per weight-sample mode and S."""
  from meshbayes.models.configurables import preset_config
  from meshbayes.models.encoder_decoder import DECODE_WEIGHTS, EncoderDecoderModel

  model = EncoderDecoderModel(preset_config(model_name), num_train_units=1e6)
  shape = (batch_size, length)
  shapes = {name: shape for name in ("encoder_input_tokens", "decoder_input_tokens",
                                     "decoder_target_tokens", "decoder_loss_weights")}
  params = jax.eval_shape(lambda: nn.unbox(model.get_initial_variables(
      jax.random.key(0), shapes)["params"]))
  batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32)
           for name in ("encoder_input_tokens", "decoder_target_tokens")}
  gib = lambda n: n / 2**30
  report: dict[str, Any] = {"model": model_name, "batch_size": batch_size,
                            "max_length": length,
                            "params_gib": gib(sum(x.size * x.dtype.itemsize
                                                  for x in jax.tree.leaves(params)))}
  for mode in DECODE_WEIGHTS:
    for count in samples:
      fn = jax.jit(functools.partial(
          dataclasses.replace(model, decode_weights=mode).predict_batch_with_aux,
          method=method, num_samples=count))
      memory = fn.lower(params, batch, jax.random.key(0)).compile().memory_analysis()
      report[f"{mode}, S={count}"] = {
          "argument_gib": gib(memory.argument_size_in_bytes),
          "temp_gib": gib(memory.temp_size_in_bytes),
          "total_gib": gib(memory.argument_size_in_bytes + memory.temp_size_in_bytes
                           + memory.output_size_in_bytes)}
  return report
