"""Benchmarks of the cost of being Bayesian, as ratios measured in one run; prints a JSON report.

Every figure compares programs timed in the same process, alternating round
after round so that machine load hits all sides alike; each side's time is its
fastest round, the medians reported too. The goals and the measured figures
are in docs/results/2026-11-cpu-train-step.md; how they are measured, docs/performance.md.

Sections (``--sections``, default all):

- ``step``: the trainer's train step of one preset, deterministic vs Bayesian
  (AdamW) and IVON vs AdamW: time ratios, compiled FLOP ratios
  (``meshbayes.scaling.hlo``) and their quotient, the efficiency quotient;
  ``--step_ivon_ablations`` adds IVON without its noise draw and without its
  stddev metrics; ``--step_noise_ablations`` adds the Bayesian step with its
  noise stored instead of regenerated and with the local reparameterization's
  variance kept (what regenerating costs, and how much of it is the variance's
  matmul: paired per-round time ratios with bootstrap intervals).
  ``--step_target=h200:1`` (or ``h100:N``) compiles the deterministic and
  Bayesian steps for that GPU instead, without one (JAX's CUDA plugin needed:
  the ``gpu-aot`` extra), and reports the frozen step-time model's seconds,
  TFLOP/s and MFU of each (``roofline.FROZEN_GPU_MODEL``), with their kernels,
  HBM bytes, kernels of avoidable work and XLA's memory analysis.
- ``layers``: forward + backward of one Dense layer per estimator against the
  deterministic one, with its ``floor`` (matmul FLOP ratio plus the noise
  drawn alone), for each PRNG implementation of ``--prng_impls``; each
  Bayesian layer also with its noise stored, not drawn again (``--stored_noise``).
- ``pipeline``: the input pipeline against the trainer's consumption, for
  each task of ``--pipeline_tasks`` (``tatoeba_enfr`` needs ``make data``).
- ``decode``: decoding with the posterior mean against model averaging over
  S weight samples, and the compiled decode's memory per S.
- ``trainer``: the trainer's steady-state step against the bare compiled step
  (``overhead``) and its host input alone (``input_seconds``), per preset of
  ``--trainer_models``.
- ``resume``: seconds to the first step of a resumed run, the input position
  restored from the checkpoint against skipping the consumed batches.

On CPUs the step time depends on ``MESHBAYES_MALLOC`` (``meshbayes/runtime/host_memory.py``);
the report's ``malloc`` says which tunables a run had.

  python -m meshbayes.tools.bench                      # all sections
  python -m meshbayes.tools.bench --sections=layers --rows=2048 --in_features=1024 --out_features=4096
"""

from __future__ import annotations

import argparse
import dataclasses
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from meshbayes import layers
from meshbayes.layers import estimators
from meshbayes.metrics import bootstrap
from meshbayes.runtime import host_memory, strict_json
from meshbayes.training import ivon, train_step

SECTIONS = ("step", "layers", "pipeline", "decode", "trainer", "resume")


def alternate(programs: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1,
              record: dict[str, list[float]] | None = None
              ) -> tuple[dict[str, float], dict[str, float]]:
  """Fastest and median seconds of each program, timed round-robin (each call blocks);
  every round's seconds go to ``record`` when given."""
  for _ in range(warmup):
    for program in programs.values():
      jax.block_until_ready(program())
  times: dict[str, list[float]] = {name: [] for name in programs}
  for _ in range(rounds):
    for name, program in programs.items():
      start = time.perf_counter()
      jax.block_until_ready(program())
      times[name].append(time.perf_counter() - start)
  if record is not None:
    record.update(times)
  return ({name: min(t) for name, t in times.items()},
          {name: statistics.median(t) for name, t in times.items()})


def paired_time_ratio(times: dict[str, list[float]], name: str, baseline: str
                      ) -> dict[str, float]:
  """The median over rounds of ``name``'s seconds over ``baseline``'s in the same round,
  with its bootstrap interval over rounds (load that hits a whole round cancels)."""
  ratios = np.asarray(times[name]) / np.asarray(times[baseline])
  return bootstrap.bootstrap(lambda i: {"ratio": float(np.median(ratios[i]))},
                             [len(ratios)])["ratio"].as_dict()


# --- step: the trainer's train step, deterministic vs Bayesian ---------------------------------

def compiled_train_step(spec: Any, partitioner: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
  """A fresh train state of ``spec`` and the trainer's jitted step compiled for ``batch``."""
  from meshbayes.scaling.aot import build_steps
  from meshbayes.training.train_step import abstract_state, init_train_state, jit_train_step

  model, steps = build_steps(spec)
  shapes = spec.input_shapes()
  # Placed outside the activation rules: unboxing inside them would constrain.
  placed = partitioner.placed(abstract_state(model, steps, shapes))
  state, shardings = partitioner.init(
      lambda k: init_train_state(model, steps.optimizer, shapes, k), jax.random.key(0))
  with partitioner.activation_rules():
    compiled = jit_train_step(steps, partitioner, shardings).lower(placed, batch).compile()
  return state, compiled


def traced_step_flops(spec: Any, partitioner: Any, batch: dict[str, Any]) -> float:
  """Matmul FLOPs of one train step over all devices, counted in its jaxpr (any platform)."""
  from meshbayes.scaling.aot import build_steps, jaxpr_matmul_flops
  from meshbayes.training.train_step import abstract_state

  model, steps = build_steps(spec)
  placed = partitioner.placed(abstract_state(model, steps, spec.input_shapes()))
  with partitioner.activation_rules():
    return jaxpr_matmul_flops(jax.make_jaxpr(steps.train_step)(placed, batch).jaxpr)


# IVON's step with one kind of its extra work taken out while it is traced (measurement
# only: nothing is trained so): its noise drawn as zeros; its posterior-stddev metrics.
IVON_ABLATIONS = {
    "ivon_without_noise": lambda: mock.patch.object(
        ivon.IVON, "noise", lambda config, state, index: jax.tree.map(jnp.zeros_like,
                                                                      state.hessian)),
    "ivon_without_stddev_metrics": lambda: mock.patch.object(
        train_step, "posterior_stddev_metrics", lambda stddevs: {}),
}


# The Bayesian step with its layers' estimators swapped while it is traced (measurement
# only): as written, keeping their noise for the backward pass (before issue 32); and
# regenerating but keeping the local reparameterization's variance.
_KEEP_VARIANCE = jax.checkpoint_policies.save_only_these_names(estimators.VARIANCE_NAME)
NOISE_ABLATIONS = {
    "bayesian_storing_noise": lambda: estimators.swapped(estimators.STORED),
    "bayesian_keeping_variance": lambda: estimators.swapped({
        table: {"local_reparameterization": estimators.regenerating(
            estimators.local_reparameterization, policy=_KEEP_VARIANCE)}
        for table in ("DENSE", "CONV")}),
}


def bench_step(args: argparse.Namespace) -> dict[str, Any]:
  from meshbayes.scaling import hlo, peaks
  from meshbayes.partitioning import Partitioner

  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])
  programs, flops, states = {}, {}, {}
  rng = np.random.default_rng(0)
  # (deterministic model, optimizer): the baseline, Bayesian layers, and IVON's posterior
  # learned by the optimizer on the deterministic model.
  kinds = {"deterministic": (True, "adamw"), "bayesian": (False, "adamw"),
           "ivon": (True, "ivon")}
  if args.step_ivon_ablations:
    kinds.update({name: (True, "ivon") for name in IVON_ABLATIONS})
  if args.step_noise_ablations:
    kinds.update({name: (False, "adamw") for name in NOISE_ABLATIONS})
  ablations = {**IVON_ABLATIONS, **NOISE_ABLATIONS}
  for kind, (deterministic, optimizer) in kinds.items():
    spec = step_spec(args, deterministic, optimizer)
    shapes = spec.input_shapes()
    vocab = spec.config().vocab_size
    batch = {name: jnp.asarray(rng.integers(1, vocab, size=shape), jnp.int32)
             for name, shape in shapes.items()}
    batch["decoder_loss_weights"] = jnp.ones(shapes["decoder_loss_weights"], jnp.int32)
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
  rounds: dict[str, list[float]] = {}
  times, medians = alternate(programs, args.step_rounds, warmup=1, record=rounds)
  time_ratio = times["bayesian"] / times["deterministic"]
  ratio = lambda count: flops["bayesian"][count] / flops["deterministic"][count]
  device = jax.devices()[0]  # the one device the step ran on: traced FLOPs are its own
  return {"model": args.step_model, "batch_size": args.step_batch, "length": args.step_length,
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
          **({"regenerating_time_ratio": paired_time_ratio(rounds, "bayesian",
                                                           "bayesian_storing_noise"),
              "keeping_variance_time_ratio": paired_time_ratio(
                  rounds, "bayesian_keeping_variance", "bayesian_storing_noise")}
             if args.step_noise_ablations else {}),
          "goal": "efficiency_quotient <= 1.05, ivon_time_ratio <= 1.10"}


def step_spec(args: argparse.Namespace, deterministic: bool, optimizer: str = "adamw") -> Any:
  """The step section's train step: ``--step_model`` on one device, ``data_only`` rules."""
  from meshbayes.scaling.aot import StepSpec, parse_overrides

  overrides = {name: value for name, value in (("dtype", args.step_dtype),
                                               ("remat_policy", args.step_remat)) if value}
  overrides.update(parse_overrides(args.step_overrides))
  return StepSpec(model=args.step_model, deterministic=deterministic, optimizer=optimizer,
                  batch_size=args.step_batch, input_length=args.step_length,
                  target_length=args.step_length, model_parallel=1, partitioning="data_only",
                  num_train_units=1e6, overrides=tuple(overrides.items()))


def predict_step_on_gpu(args: argparse.Namespace) -> dict[str, Any]:
  """The step section for a GPU target, compiled without one: the frozen model's figures."""
  from meshbayes.scaling import aot, targets

  target = targets.parse_target(args.step_target)
  if target.platform != "gpu":
    raise SystemExit(f"--step_target={args.step_target}: name a GPU (h100:N, h200:N)")
  programs = {}
  for kind, deterministic in (("deterministic", True), ("bayesian", False)):
    record = aot.compile_and_profile(step_spec(args, deterministic), target)
    if record.get("error") or not record.get("roofline"):
      raise SystemExit(f"--step_target={args.step_target}: the {kind} step did not compile: "
                       f"{record.get('error') or record.get('message')}")
    prediction = record["roofline"]["max"]
    programs[kind] = {
        "seconds": prediction["step_seconds"],
        "tflops_per_second": prediction["tflops_per_second"], "mfu": prediction["mfu"],
        "matmul_seconds": prediction["compute_seconds"],
        "memory_seconds": prediction["memory_seconds"],
        "kernel_seconds": prediction["kernel_seconds"],
        "kernels": sum(op["executed"] for op in record["operations_per_device"].values()),
        "hbm_bytes": sum(op["bytes"] for op in record["operations_per_device"].values()),
        "avoidable_kernels": record["avoidable_kernels"],
        "model_flops": record["model_flops_per_device"],
        **{name: record[f"{name}_per_device"] for name in (
            "argument_bytes", "temp_bytes", "peak_bytes")},
        "fits": record["fits"], "compile_seconds": record["compile_seconds"]}
  det, bayes = programs["deterministic"], programs["bayesian"]
  time_ratio = bayes["seconds"] / det["seconds"]
  flop_ratio = bayes["model_flops"] / det["model_flops"]
  return {"target": target.name, "model": args.step_model, "batch_size": args.step_batch,
          "length": args.step_length, "dtype": args.step_dtype, "remat": args.step_remat,
          "step_time_model": "roofline.FROZEN_GPU_MODEL", "programs": programs,
          "time_ratio": time_ratio, "flop_ratio": flop_ratio,
          "efficiency_quotient": time_ratio / flop_ratio}


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
  from meshbayes.scaling import hlo

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
  from meshbayes.layers import estimators
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


@contextlib.contextmanager
def jax_random_noise():
  """Traces the estimators with ``jax.random``'s samplers (the layers' noise before
  ``estimators.standard_normal`` and ``estimators.rademacher``), for comparison."""
  from meshbayes.layers import estimators
  saved = estimators.standard_normal, estimators.rademacher
  estimators.standard_normal = lambda key, shape, dtype=jnp.float32: jax.random.normal(
      key, tuple(shape), dtype)
  estimators.rademacher = lambda key, shape, dtype: jax.random.rademacher(key, tuple(shape),
                                                                          dtype)
  try:
    yield
  finally:
    estimators.standard_normal, estimators.rademacher = saved


def bench_layers(args: argparse.Namespace) -> dict[str, Any]:
  results: dict[str, Any] = {"rows": args.rows, "in_features": args.in_features,
                             "out_features": args.out_features, "dtype": "float32",
                             "goals": {"flipout": 2.1, "local_reparameterization": 2.1,
                                       "reparameterization": 1.1}}
  shapes = (args.rows, args.in_features, args.out_features)
  for impl in args.prng_impls.split(","):
    impl_arg = None if impl == "default" else impl
    programs, flops = {}, {}
    for estimator in layers.ESTIMATORS:
      programs[estimator], flops[estimator] = layer_program(estimator, *shapes, impl_arg)
      if args.jax_noise and estimator != "deterministic":
        with jax_random_noise():  # the same layer drawing its noise with jax.random
          name = f"{estimator} (jax.random noise)"
          programs[name], flops[name] = layer_program(estimator, *shapes, impl_arg)
      if args.stored_noise and estimator != "deterministic":
        with estimators.swapped(estimators.STORED):  # as written: noise kept, not redrawn
          name = f"{estimator} (noise stored)"
          programs[name], flops[name] = layer_program(estimator, *shapes, impl_arg)
    for estimator in NOISE_SHAPES:
      programs[f"{estimator} noise alone"] = noise_program(estimator, *shapes, impl_arg)
    times, medians = alternate(programs, args.rounds)
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


# --- pipeline: input pipeline vs the trainer's consumption ---------------------------------------

# The demos' settings (gin_configs/examples/): task, lengths, global batch, model preset and
# the config fields the example's model gin changes.
PIPELINE_DEMOS = {
    "tatoeba_enfr": dict(lengths=(24, 32), batch_size=32, model="tiny", overrides=(
        ("emb_dim", 128), ("num_heads", 4), ("head_dim", 32), ("mlp_dim", 256),
        ("vocab_size", 8000))),  # tatoeba_enfr_tiny_bayesian.gin (make demo)
    "synthetic_reverse": dict(lengths=(16, 16), batch_size=32, model="tiny",
                              overrides=()),  # tiny_synthetic_bayesian.gin (demo-synthetic)
}


def bench_pipeline(args: argparse.Namespace) -> dict[str, Any]:
  return {task: pipeline_against_trainer(task, args.pipeline_seconds)
          for task in args.pipeline_tasks.split(",")}


def _demo_input(task: str):
  """A task's demo settings, its ``TaskData``, a data-parallel partitioner, this host's
  ``HostInput`` as the trainer builds it, and the demo's train-step spec."""
  from meshbayes.data import TaskData
  from meshbayes.training.host_input import HostInput
  from meshbayes.partitioning import Partitioner
  from meshbayes.scaling.aot import StepSpec

  demo = PIPELINE_DEMOS[task]
  inputs, targets = demo["lengths"]
  data = TaskData(task=task, feature_lengths={"inputs": inputs, "targets": targets},
                  batch_size=demo["batch_size"])
  partitioner = Partitioner(rules="data_only")
  layout = partitioner.data_layout(data.batch_size)
  spec = StepSpec(model=demo["model"], overrides=demo["overrides"],
                  batch_size=demo["batch_size"], input_length=inputs, target_length=targets,
                  model_parallel=1, partitioning="data_only")
  return data, partitioner, HostInput(data, layout, input_shards=layout.num_shards), spec


def pipeline_against_trainer(task: str, seconds: float) -> dict[str, Any]:
  """Batches per second of the input pipeline against train steps per second of its demo."""
  _, partitioner, host_input, spec = _demo_input(task)
  batches = host_input.train_batches()  # as the trainer reads
  for _ in range(5):
    next(batches)
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    partitioner.global_batch(next(batches))  # what the trainer does with each batch
    count += 1
  pipeline_rate = count / (time.perf_counter() - start)

  batch = partitioner.global_batch(next(batches))
  state, step_fn = compiled_train_step(spec, partitioner, batch)
  state, metrics = step_fn(state, batch)
  jax.block_until_ready(metrics)
  steps_done, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    state, metrics = step_fn(state, batch)
    float(metrics["loss"])  # the trainer reads the metrics every step
    steps_done += 1
  step_rate = steps_done / (time.perf_counter() - start)
  demo = PIPELINE_DEMOS[task]
  return {"batch_size": demo["batch_size"], "lengths": list(demo["lengths"]),
          "model": f"{demo['model']} {dict(demo['overrides'])}",
          "pipeline_batches_per_second": pipeline_rate, "train_steps_per_second": step_rate,
          "ratio": pipeline_rate / step_rate, "goal": "ratio >= 10"}


# --- decode: posterior mean vs Bayesian model averaging ------------------------------------------

def bench_decode(args: argparse.Namespace) -> dict[str, Any]:
  from meshbayes.models.configurables import preset_config
  from meshbayes.models.encoder_decoder import EncoderDecoderModel

  model = EncoderDecoderModel(preset_config(args.decode_model), num_train_units=1e6)
  shape = (args.decode_batch, args.decode_length)
  shapes = {name: shape for name in ("encoder_input_tokens", "decoder_input_tokens",
                                     "decoder_target_tokens", "decoder_loss_weights")}
  params = nn.unbox(jax.jit(lambda k: model.get_initial_variables(k, shapes))(
      jax.random.key(0))["params"])
  vocab = model.config.vocab_size
  tokens = jax.random.randint(jax.random.key(1), shape, 2, vocab, jnp.int32)
  batch = {"encoder_input_tokens": tokens, "decoder_target_tokens": tokens}
  programs = {}
  for samples in [0] + [int(s) for s in args.decode_samples.split(",")]:
    decode = jax.jit(functools.partial(model.predict_batch_with_aux, method=args.decode_method,
                                       num_samples=samples))
    programs[f"S={samples}" if samples else "posterior_mean"] = functools.partial(
        lambda d: d(params, batch, jax.random.key(3))[0], decode)
  for samples in [int(s) for s in args.decode_samples.split(",")]:
    decode = jax.jit(functools.partial(
        dataclasses.replace(model, decode_weights="regenerated").predict_batch_with_aux,
        method=args.decode_method, num_samples=samples))
    programs[f"S={samples}, regenerated"] = functools.partial(
        lambda d: d(params, batch, jax.random.key(3))[0], decode)
  times, _ = alternate(programs, args.rounds)
  sequences = args.decode_batch
  return {"model": args.decode_model, "method": args.decode_method, "batch_size": sequences,
          "max_length": args.decode_length,
          "sequences_per_second": {k: sequences / t for k, t in times.items()},
          "slowdown_vs_posterior_mean": {k: t / times["posterior_mean"] for k, t in times.items()
                                         if k != "posterior_mean"},
          "memory": decode_memory(args)}


def decode_memory(args: argparse.Namespace) -> dict[str, Any]:
  """GiB of the compiled decode's arguments and temporaries per weight-sample mode and S."""
  from meshbayes.models.configurables import preset_config
  from meshbayes.models.encoder_decoder import DECODE_WEIGHTS, EncoderDecoderModel

  model = EncoderDecoderModel(preset_config(args.decode_memory_model), num_train_units=1e6)
  shape = (args.decode_batch, args.decode_length)
  shapes = {name: shape for name in ("encoder_input_tokens", "decoder_input_tokens",
                                     "decoder_target_tokens", "decoder_loss_weights")}
  params = jax.eval_shape(lambda: nn.unbox(model.get_initial_variables(
      jax.random.key(0), shapes)["params"]))
  batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32)
           for name in ("encoder_input_tokens", "decoder_target_tokens")}
  gib = lambda n: n / 2**30
  report: dict[str, Any] = {"model": args.decode_memory_model, "batch_size": args.decode_batch,
                            "max_length": args.decode_length,
                            "params_gib": gib(sum(x.size * x.dtype.itemsize
                                                  for x in jax.tree.leaves(params)))}
  for mode in DECODE_WEIGHTS:
    for samples in [int(s) for s in args.decode_memory_samples.split(",")]:
      fn = jax.jit(functools.partial(
          dataclasses.replace(model, decode_weights=mode).predict_batch_with_aux,
          method=args.decode_method, num_samples=samples))
      memory = fn.lower(params, batch, jax.random.key(0)).compile().memory_analysis()
      report[f"{mode}, S={samples}"] = {
          "argument_gib": gib(memory.argument_size_in_bytes),
          "temp_gib": gib(memory.temp_size_in_bytes),
          "total_gib": gib(memory.argument_size_in_bytes + memory.temp_size_in_bytes
                           + memory.output_size_in_bytes)}
  return report


# --- resume: the input's position restored vs batches skipped -----------------------------------

def bench_trainer(args: argparse.Namespace) -> dict[str, Any]:
  steps = dict(zip(args.trainer_models.split(","), map(int, args.trainer_steps.split(","))))
  report = {model: trainer_against_bare_step(model, n, args.step_batch, args.step_length,
                                             args.step_rounds)
            for model, n in steps.items()}
  report["goal"] = "overhead <= 0.03"
  return report


def trainer_against_bare_step(model_name: str, num_steps: int, batch_size: int, length: int,
                              rounds: int) -> dict[str, Any]:
  """Seconds per step of the trainer's loop and of its compiled step alone, same program."""
  import tempfile
  from meshbayes.training import trainer
  from meshbayes.training.run_configs import CheckpointConfig
  from meshbayes.data import TaskData
  from meshbayes.training.host_input import HostInput
  from meshbayes.partitioning import Partitioner
  from meshbayes.scaling.aot import StepSpec, build_steps

  spec = StepSpec(model=model_name, overrides=(("vocab_size", 128),), batch_size=batch_size,
                  input_length=length, target_length=length, model_parallel=1,
                  partitioning="data_only", num_train_units=1e6)
  partitioner = Partitioner(data=1, model=1, rules="data_only", devices=jax.devices()[:1])
  rng = np.random.default_rng(0)
  shapes = spec.input_shapes()
  batch = {name: jnp.asarray(rng.integers(1, 32, size=shape), jnp.int32)
           for name, shape in shapes.items()}
  batch["decoder_loss_weights"] = jnp.ones(shapes["decoder_loss_weights"], jnp.int32)
  state, compiled = compiled_train_step(spec, partitioner, batch)

  def bare() -> float:
    nonlocal state
    state, metrics = compiled(state, batch)  # warm, and the last run's work is done
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(num_steps):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / num_steps

  data = TaskData(task="synthetic_reverse", feature_lengths={"inputs": length,
                  "targets": length}, batch_size=batch_size)

  def trained() -> float:
    with tempfile.TemporaryDirectory() as model_dir:
      # Step 1 compiles; steps 2..num_steps + 1 are the logged window.
      trainer.train(model_dir=model_dir, model=build_steps(spec)[0], data=data,
                    train_steps=num_steps + 1, partitioner=partitioner,
                    log_period=num_steps + 1,
                    checkpoint=CheckpointConfig(period=num_steps + 1, async_save=False))
      logged = json.loads((Path(model_dir) / "metrics.jsonl").read_text().splitlines()[0])
    return logged["step_seconds"]

  def host_input() -> float:
    layout = partitioner.data_layout(batch_size)
    batches = HostInput(data, layout, layout.num_shards).train_batches()
    jax.block_until_ready(partitioner.global_batch(next(batches)))
    start = time.perf_counter()
    for _ in range(num_steps):
      jax.block_until_ready(partitioner.global_batch(next(batches)))  # as the trainer's loop
    return (time.perf_counter() - start) / num_steps

  # Alternating, fastest of each (load only adds time).
  times: dict[str, list[float]] = {"trainer": [], "bare": [], "input": []}
  for _ in range(rounds):
    times["bare"].append(bare())
    with contextlib.redirect_stdout(sys.stderr):  # the JSON report owns stdout
      times["trainer"].append(trained())
    times["input"].append(host_input())
  fastest = {k: min(v) for k, v in times.items()}
  return {"steps": num_steps, "batch_size": batch_size, "length": length,
          "seconds": fastest, "median_seconds": {k: statistics.median(v) for k, v in times.items()},
          "overhead": fastest["trainer"] / fastest["bare"] - 1,
          "input_seconds": fastest["input"], "input_share": fastest["input"] / fastest["bare"]}


def bench_resume(args: argparse.Namespace) -> dict[str, Any]:
  return resume_at_step(args.resume_task, args.resume_step)


def resume_at_step(task: str, step: int) -> dict[str, Any]:
  """Seconds to the first train step of a resume at ``step`` of ``task``'s demo, by method."""
  import tempfile

  from meshbayes.training import checkpoints

  data, partitioner, host_input, spec = _demo_input(task)
  layout = host_input.layout
  start = time.perf_counter()
  batches = host_input.train_batches()
  for _ in range(step):
    next(batches)
  advance_seconds = time.perf_counter() - start
  expected = next(host_input.train_batches(start_batch=step))["encoder_input_tokens"]

  start = time.perf_counter()
  state, step_fn = compiled_train_step(spec, partitioner, partitioner.global_batch(
      {name: np.ones(shape, np.int32) for name, shape in data.input_shapes().items()}))
  compile_seconds = time.perf_counter() - start

  with tempfile.TemporaryDirectory() as tmp:
    ckpts = checkpoints.Checkpoints(Path(tmp) / "checkpoints", async_save=False)
    start = time.perf_counter()
    ckpts.save(step, {"dummy": np.zeros(1, np.float32)}, {"data_position": step},
               batches.states())
    ckpts.wait()
    save_seconds = time.perf_counter() - start
    step_dir = ckpts.step_dir(step)
    state_bytes = sum(len(b) for b in checkpoints.read_input_states(step_dir).values())
    methods = {
        "restored_state": lambda: host_input.train_batches(
            states=checkpoints.read_input_states(step_dir, host_input.state_names)),
        "skip_tf_data": lambda: data.train_dataset(layout).skip(step).as_numpy_iterator(),
        "skip_fallback": lambda: host_input.train_batches(start_batch=step)}
    seconds, same = {}, True
    for name, open_input in methods.items():
      start = time.perf_counter()
      batch = next(open_input())
      state, metrics = step_fn(state, partitioner.global_batch(batch))
      float(metrics["loss"])
      seconds[name] = time.perf_counter() - start
      same &= bool(np.array_equal(batch["encoder_input_tokens"], expected))
    ckpts.close()
  return {"task": task, "step": step, "batch_size": data.batch_size,
          "seconds_to_first_step": seconds,
          "speedup_vs_skip_tf_data": seconds["skip_tf_data"] / seconds["restored_state"],
          "same_first_batch": same, "input_state_bytes": state_bytes,
          "checkpoint_save_seconds": save_seconds, "compile_seconds": compile_seconds,
          "advance_seconds": advance_seconds,
          "methods": {"restored_state": "the checkpoint's iterator state (this version)",
                      "skip_tf_data": "ds.skip(step) in tf.data (the previous version)",
                      "skip_fallback": "batches read and dropped (checkpoints without a "
                                       "state)"}}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sections", default=",".join(SECTIONS),
                      help=f"comma-separated, from {', '.join(SECTIONS)}")
  parser.add_argument("--rounds", type=int, default=5, help="timed rounds per program")
  parser.add_argument("--step_model", default="small")
  # 16 x 64 = 1,024 tokens per step: what each core of the paper's v2-512 run processes.
  parser.add_argument("--step_batch", type=int, default=16)
  parser.add_argument("--step_length", type=int, default=64)
  parser.add_argument("--step_rounds", type=int, default=3)
  parser.add_argument("--step_dtype", default=None, help="compute dtype (default: the preset's)")
  parser.add_argument("--step_remat", default=None,
                      help="none, full or minimal (default: the preset's)")
  parser.add_argument("--step_overrides", default="",
                      help="TransformerConfig fields of the step's model, e.g. "
                           "scan_layers=False,attention_dropout_rate=0.0")
  parser.add_argument("--step_target", default=None,
                      help="a GPU (h100:N, h200:N) to compile the step for, without running "
                           "it: the frozen step-time model's seconds, TFLOP/s and MFU")
  parser.add_argument("--step_ivon_ablations", action="store_true",
                      help="also time IVON's step without its noise draw and without its "
                           "posterior-stddev metrics (where its excess over AdamW goes)")
  parser.add_argument("--step_noise_ablations", action="store_true",
                      help="also time the Bayesian step with its noise stored instead of "
                           "regenerated, and with the local reparameterization's variance "
                           "kept (what regenerating costs)")
  parser.add_argument("--rows", type=int, default=2048)
  parser.add_argument("--in_features", type=int, default=1024)
  parser.add_argument("--out_features", type=int, default=4096)
  parser.add_argument("--prng_impls", default="default,rbg",
                      help="key implementations for the layer section ('default': jax's)")
  parser.add_argument("--jax_noise", action=argparse.BooleanOptionalAction, default=True,
                      help="also time each Bayesian layer with jax.random's samplers")
  parser.add_argument("--stored_noise", action=argparse.BooleanOptionalAction, default=True,
                      help="also time each Bayesian layer with its noise stored for the "
                           "backward pass, not drawn again (what regenerating costs)")
  parser.add_argument("--pipeline_seconds", type=float, default=5.0)
  parser.add_argument("--pipeline_tasks", default="tatoeba_enfr,synthetic_reverse",
                      help=f"from {', '.join(PIPELINE_DEMOS)}")
  parser.add_argument("--decode_model", default="tiny")
  parser.add_argument("--decode_batch", type=int, default=32)
  parser.add_argument("--decode_length", type=int, default=16)
  parser.add_argument("--decode_method", default="greedy", choices=("greedy", "beam", "sample"))
  parser.add_argument("--decode_samples", default="1,4")
  parser.add_argument("--decode_memory_model", default="small")
  parser.add_argument("--decode_memory_samples", default="1,4,8")
  parser.add_argument("--trainer_models", default="tiny,small")
  parser.add_argument("--trainer_steps", default="200,12",
                      help="timed steps per trainer run, one per --trainer_models entry")
  parser.add_argument("--resume_task", default="tatoeba_enfr",
                      help=f"from {', '.join(PIPELINE_DEMOS)}")
  parser.add_argument("--resume_step", type=int, default=10_000)
  parser.add_argument("--json", default=None, help="also write the report here")
  args = parser.parse_args(argv)
  unknown = set(args.sections.split(",")) - set(SECTIONS)
  if unknown:
    parser.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from "
                 f"{', '.join(SECTIONS)}")
  from meshbayes.scaling.aot import parse_overrides
  try:
    parse_overrides(args.step_overrides)
  except ValueError as error:
    parser.error(f"--step_overrides: {error}")
  if len(args.trainer_models.split(",")) != len(args.trainer_steps.split(",")):
    parser.error(f"--trainer_steps={args.trainer_steps}: give one count per --trainer_models "
                 f"entry ({args.trainer_models})")
  unknown = set(args.pipeline_tasks.split(",") + [args.resume_task]) - set(PIPELINE_DEMOS)
  if unknown:
    parser.error(f"--pipeline_tasks, --resume_task: unknown {', '.join(sorted(unknown))}; "
                 f"choose from {', '.join(PIPELINE_DEMOS)}")
  return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  runners = {"step": predict_step_on_gpu if args.step_target else bench_step,
             "layers": bench_layers, "pipeline": bench_pipeline,
             "decode": bench_decode, "trainer": bench_trainer, "resume": bench_resume}
  report: dict[str, Any] = {"devices": [str(d) for d in jax.devices()],
                            "jax_version": jax.__version__, "rounds": args.rounds,
                            # The malloc settings it ran with (meshbayes.runtime.host_memory).
                            "malloc": host_memory.malloc_settings()}
  for section in args.sections.split(","):
    start = time.perf_counter()
    report[section] = runners[section](args)
    report[section]["bench_seconds"] = time.perf_counter() - start
  text = strict_json.dumps(report, null_reasons=strict_json.NULL_REASONS, indent=2)
  print(text)
  if args.json:
    Path(args.json).write_text(text + "\n")
  return report


if __name__ == "__main__":
  host_memory.exec_with_malloc_tunables()
  main()
