"""Ahead-of-time compiles of the trainer's own train step, and what they cost per device.

``compile_step`` builds the step as ``meshbayes.train`` does (``jit_train_step`` with the
partitioner's state shardings and a donated state) for a preset on a target, compiles it
without running it, and returns one record: memory, fit, FLOPs and collectives.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import math
import re
import time
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
from jax.sharding import NamedSharding

from meshbayes import partitioning
from meshbayes.field_checks import positive_ints
from meshbayes.layers import count_parameters
from meshbayes.models.configurables import PRESETS, preset_config
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import Estimators, TransformerConfig
from meshbayes.scaling import fused_attention, hlo, hlo_profile, kernels, roofline
from meshbayes.scaling.targets import GIB, Target
from meshbayes.training.optimizers import OPTIMIZERS, KLWeight, Optimizer
from meshbayes.training.train_step import StepFunctions, abstract_state, jit_train_step

FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
            "decoder_loss_weights")
# Convenience overrides that set several TransformerConfig fields at once.
_ALIASES = {"num_layers": ("num_encoder_layers", "num_decoder_layers")}
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(TransformerConfig)} - {"estimators"}


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """The train step to compile: model, batch, optimizer and partitioning.

  Attributes:
    model: a size preset (``models.configurables.PRESETS``).
    deterministic: the deterministic twin (every component deterministic).
    overrides: ``TransformerConfig`` fields to change (``emb_dim``,
      ``num_heads``, ``mlp_dim``, ``remat_policy``, ...; ``num_layers`` sets
      both stacks), as ``(name, value)`` pairs.
    estimators: ``(component, estimator)`` pairs that change the estimator of
      a component (``models.Estimators`` fields), after ``deterministic``.
    batch_size: global batch (sequences per step).
    input_length: encoder tokens per sequence.
    target_length: decoder tokens per sequence.
    optimizer: ``adamw``, ``adafactor``, ``sgd`` or ``ivon`` (``meshbayes.training.optimizers``;
      ``ivon`` with ``deterministic``).
    num_microbatches: gradient accumulation steps within the step.
    partitioning: rule preset (``data_only``, ``megatron``, ``fsdp_tp``).
    model_parallel: size of the ``model`` mesh axis (capped at the device
      count); ``data`` takes the rest.
    num_train_units: the KL's ``D`` (only a constant in the step).
  """

  model: str = "paper"
  deterministic: bool = False
  overrides: tuple[tuple[str, Any], ...] = ()
  estimators: tuple[tuple[str, str], ...] = ()
  batch_size: int = 256
  input_length: int = 256
  target_length: int = 256
  optimizer: str = "adamw"
  num_microbatches: int = 1
  partitioning: str = "fsdp_tp"
  model_parallel: int = 8
  num_train_units: float = 1e9

  def __post_init__(self):
    object.__setattr__(self, "overrides", tuple(sorted(dict(self.overrides).items())))
    object.__setattr__(self, "estimators", tuple(sorted(dict(self.estimators).items())))
    components = {f.name for f in dataclasses.fields(Estimators)}
    for name, _ in self.estimators:
      if name not in components:
        raise ValueError(f"StepSpec: estimator component {name!r} is not one of "
                         f"{', '.join(sorted(components))}")
    if self.model not in PRESETS:
      raise ValueError(f"StepSpec: model={self.model!r} is not one of {', '.join(PRESETS)}")
    for name, _ in self.overrides:
      if name not in _CONFIG_FIELDS and name not in _ALIASES:
        raise ValueError(f"StepSpec: override {name!r} is not a TransformerConfig field; "
                         f"known: {', '.join(sorted(_CONFIG_FIELDS | set(_ALIASES)))}")
    positive_ints("StepSpec", self, "batch_size", "input_length", "target_length",
                  "num_microbatches", "model_parallel")
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"StepSpec: optimizer={self.optimizer!r} must be one of {OPTIMIZERS}")
    if self.partitioning not in partitioning.PRESETS:
      raise ValueError(f"StepSpec: partitioning={self.partitioning!r} must be one of "
                       f"{', '.join(sorted(partitioning.PRESETS))}")

  def replace(self, **changes: Any) -> StepSpec:
    return dataclasses.replace(self, **changes)

  def with_overrides(self, **overrides: Any) -> StepSpec:
    return self.replace(overrides=tuple({**dict(self.overrides), **overrides}.items()))

  def config(self) -> TransformerConfig:
    """The preset's ``TransformerConfig`` with the overrides applied."""
    changes: dict[str, Any] = {}
    for name, value in self.overrides:
      for field in _ALIASES.get(name, (name,)):
        changes[field] = value
    config = preset_config(self.model, deterministic=self.deterministic)
    if self.estimators:
      changes["estimators"] = dataclasses.replace(config.estimators, **dict(self.estimators))
    return config.replace(**changes)

  def input_shapes(self) -> dict[str, tuple[int, int]]:
    lengths = {"encoder_input_tokens": self.input_length}
    return {name: (self.batch_size, lengths.get(name, self.target_length)) for name in FEATURES}


def parse_overrides(text: str) -> tuple[tuple[str, Any], ...]:
  """``StepSpec.overrides`` from ``name=value,...`` (values as Python literals, else strings).

  >>> parse_overrides("scan_layers=False,dtype=bfloat16,attention_dropout_rate=0.0")
  (('scan_layers', False), ('dtype', 'bfloat16'), ('attention_dropout_rate', 0.0))
  """
  pairs = []
  for item in (part.strip() for part in text.split(",") if part.strip()):
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
      raise ValueError(f"override {item!r} is not name=value")
    try:
      parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
      parsed = value.strip()
    pairs.append((name.strip(), parsed))
  return tuple(pairs)


def build_steps(spec: StepSpec) -> tuple[EncoderDecoderModel, StepFunctions]:
  """The model and the trainer's step functions for ``spec``, built as ``meshbayes.train`` does."""
  model = EncoderDecoderModel(spec.config(), num_train_units=spec.num_train_units)
  steps = StepFunctions.build(model, Optimizer(name=spec.optimizer), KLWeight(),
                              num_microbatches=spec.num_microbatches)
  return model, steps


def make_partitioner(spec: StepSpec, target: Target) -> partitioning.Partitioner:
  """The partitioner of ``spec`` over the target's devices."""
  devices = target.devices()
  model = min(spec.model_parallel, len(devices))
  return partitioning.Partitioner(data=-1, model=model, rules=spec.partitioning, devices=devices)


def bytes_per_device(placed: Any) -> int:
  """Per-device bytes of sharded arrays, from their shard shapes (the sharding arithmetic)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(placed))


_OOM = re.compile(r"RESOURCE_EXHAUSTED|Ran out of memory|exceeds available", re.IGNORECASE)
_USED = re.compile(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm")
_TEMPORARIES = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _compiler_message(error: BaseException, limit: int = 700) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return " | ".join(lines)[:limit]


def _required_bytes(message: str, arguments: int) -> int | None:
  """Per-device bytes an out-of-memory program needed, from the compiler's message.

  The message gives either the total (``Used X of Y hbm``) or the temporaries
  alone, to which the (known) argument bytes are added.
  """
  used = _USED.search(message)
  if used:
    return int(float(used.group(1)) * _UNITS[used.group(2)])
  temporaries = _TEMPORARIES.search(message)
  if temporaries:
    return int(float(temporaries.group(1)) * _UNITS[temporaries.group(2)]) + arguments
  return None


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedStep:
  """The train step of a spec on a target, ready to lower: state, shardings, batch.

  Attributes:
    spec: the step.
    target: where it compiles.
    steps: the trainer's step functions.
    partitioner: mesh and rules over the target's devices.
    abstract: the train state's shapes, parameters boxed.
    shardings: the state's ``NamedSharding``s.
    placed: the state as ``ShapeDtypeStruct``s carrying their shardings.
    batch: the global batch, likewise.
  """

  spec: StepSpec
  target: Target
  steps: StepFunctions
  partitioner: partitioning.Partitioner
  abstract: Any
  shardings: Any
  placed: Any
  batch: dict[str, jax.ShapeDtypeStruct]

  def traced_matmul_flops(self) -> float:
    """Matmul FLOPs of one step over all devices, counted in the traced program (jaxpr)."""
    with self.partitioner.activation_rules():
      jaxpr = jax.make_jaxpr(self.steps.train_step)(self.placed, self.batch)
    return jaxpr_matmul_flops(jaxpr.jaxpr)

  def lower(self) -> jax.stages.Lowered:
    """``jit_train_step(...).lower`` inside the partitioner's activation rules."""
    with self.partitioner.activation_rules():
      return jit_train_step(self.steps, self.partitioner, self.shardings).lower(
          self.placed, self.batch)


# cuDNN's fused attention as traced: the matmuls the same attention written out would do
# (two forward; four backward, the gradients of both products' operands; no recompute).
_ATTENTION_MATMULS = {"dot_product_attention_fwd_wrapper": 2,
                      "dot_product_attention_bwd_wrapper": 4}


def jaxpr_matmul_flops(jaxpr: Any) -> float:
  """2 x multiply-adds of every ``dot_general`` in a jaxpr, scans counted per iteration.

  The model's FLOPs before partitioning, from the program as traced: divided
  by the device count it is what a perfectly split step does per device.
  cuDNN's fused attention counts as the attention it replaces.
  """
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contracting, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)
    elif eqn.primitive.name in _ATTENTION_MATMULS:  # query, key: (batch, length, heads, width)
      (batch, queries, heads, width), keys = (eqn.invars[0].aval.shape,
                                               eqn.invars[1].aval.shape[1])
      total += (2.0 * _ATTENTION_MATMULS[eqn.primitive.name]
                * batch * heads * queries * keys * width)
    repeats = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if isinstance(inner, jax.extend.core.Jaxpr):
          total += repeats * jaxpr_matmul_flops(inner)
  return total


def prepare_step(spec: StepSpec, target: Target) -> PreparedStep:
  """Builds the step, its abstract state and shardings for ``target`` (nothing compiled).

  Raises:
    ValueError: the configuration does not fit the mesh (an indivisible
      dimension, a batch the data axis cannot split).
  """
  model, steps = build_steps(spec)
  abstract = abstract_state(model, steps, spec.input_shapes())  # concrete key: before the mesh
  partitioner = make_partitioner(spec, target)
  data = partitioner.mesh.shape[partitioning.DATA_AXIS]
  if spec.batch_size % (data * spec.num_microbatches):
    raise ValueError(f"batch_size={spec.batch_size} does not split over data={data} x "
                     f"num_microbatches={spec.num_microbatches}")
  shardings = partitioner.shardings(abstract)
  batch_sharding = NamedSharding(partitioner.mesh, partitioner.batch_spec)
  batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sharding)
           for name, shape in spec.input_shapes().items()}
  return PreparedStep(spec, target, steps, partitioner, abstract, shardings,
                      partitioner.placed(abstract), batch)


def describe(spec: StepSpec, target: Target) -> dict[str, Any]:
  """The record fields that need no compile: target, model sizes, batch, settings."""
  config = spec.config()
  return {
      "target": target.label, "platform": target.platform, "generation": target.generation,
      "cores": target.num_devices, "model": spec.model,
      "estimators": ("bayesian" if config.estimators.is_bayesian else "deterministic"),
      "estimator_overrides": dict(spec.estimators),
      "overrides": dict(spec.overrides),
      "emb_dim": config.emb_dim, "num_heads": config.num_heads, "head_dim": config.head_dim,
      "num_encoder_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers, "mlp_dim": config.mlp_dim,
      "remat_policy": config.remat_policy, "dtype": config.dtype,
      "batch_size": spec.batch_size, "input_length": spec.input_length,
      "target_length": spec.target_length, "optimizer": spec.optimizer,
      "num_microbatches": spec.num_microbatches, "partitioning": spec.partitioning,
      "usable_hbm_bytes": target.usable_hbm_bytes, "fits": None, "fit_source": None,
      "message": None, "error": None,
      # Filled by a successful compile; None when the step did not compile.
      **{field: None for field in (
          "argument_bytes_per_device", "output_bytes_per_device", "alias_bytes_per_device",
          "temp_bytes_per_device", "peak_bytes_per_device", "flops_per_device",
          "all_flops_per_device", "xla_flops_per_device", "collectives")},
  }


def compile_step(spec: StepSpec, target: Target, *, keep_hlo: bool = False) -> dict[str, Any]:
  """Compiles the train step of ``spec`` for ``target``; one record of what it costs.

  Errors that belong to the configuration (a dimension the mesh cannot split,
  a batch the data axis cannot divide) and out-of-memory compiles are
  recorded, not raised: a study over many targets goes on.

  Args:
    spec: the step.
    target: where to compile.
    keep_hlo: add the compiled HLO text to the record (``hlo_text``).

  Returns:
    A JSON-serializable dict; see ``tools/scaling_study.py`` for the fields.
  """
  record = describe(spec, target)
  try:
    prepared = prepare_step(spec, target)
  except ValueError as error:
    model, steps = build_steps(spec)
    counts = count_parameters(abstract_state(model, steps, spec.input_shapes()).params)
    record.update(error=str(error), variational_params=counts.total,
                  deterministic_params=counts.deterministic_equivalent)
    return record
  counts = count_parameters(prepared.abstract.params)
  record.update(variational_params=counts.total,
                deterministic_params=counts.deterministic_equivalent,
                mesh=dict(prepared.partitioner.mesh.shape),
                state_bytes_per_device=bytes_per_device(prepared.placed),
                batch_bytes_per_device=bytes_per_device(prepared.batch),
                model_flops_per_device=prepared.traced_matmul_flops() / target.num_devices)
  start = time.perf_counter()
  try:
    compiled = prepared.lower().compile(compiler_options=target.compiler_options)
  except Exception as error:  # XlaRuntimeError and friends; OOM is one of them
    record["compile_seconds"] = time.perf_counter() - start
    message = _compiler_message(error)
    if _OOM.search(str(error)):
      record.update(fits=False, fit_source="compiler", message=message,
                    required_bytes_per_device=_required_bytes(
                        str(error), record["state_bytes_per_device"]
                        + record["batch_bytes_per_device"]))
    else:
      record["error"] = message
    return record
  record["compile_seconds"] = time.perf_counter() - start
  record.update(_analysis(compiled, target))
  if keep_hlo:
    record["hlo_text"] = compiled.as_text()
  del compiled
  gc.collect()
  return record


def compile_and_profile(spec: StepSpec, target: Target) -> dict[str, Any]:
  """``compile_step``, and on TPU and GPU targets what its program does read from its HLO.

  Adds ``hlo_profile.program_profile``'s collectives, HBM bytes and operations (kernels on
  a GPU), on a GPU the kernels of avoidable work (``avoidable_kernels``:
  ``kernels.avoidable_work``) and cuDNN's fused-attention calls
  (``fused_attention_per_device``: ``fused_attention.census``, what the frozen model v2
  charges), and ``roofline``: the predicted step (``roofline.predictions``; on a GPU the
  frozen step-time model v1's).
  """
  record = compile_step(spec, target, keep_hlo=target.platform != "cpu")
  text = record.pop("hlo_text", None)
  if text is not None:
    mesh = make_partitioner(spec, target).mesh
    record.update(hlo_profile.program_profile(text, dict(mesh.shape),
                                              hlo_profile.mesh_chip_coords(mesh)))
    if target.platform == "gpu":
      record["avoidable_kernels"] = kernels.avoidable_work(
          text, {spec.input_length, spec.target_length})
      # Read while the text is here: without it no record could be predicted by v2.
      record["fused_attention_per_device"] = fused_attention.census(text)
    del text
  record["roofline"] = roofline.predictions(record)
  return record


def _analysis(compiled: Any, target: Target) -> dict[str, Any]:
  memory = compiled.memory_analysis()
  out: dict[str, Any] = {
      "argument_bytes_per_device": int(memory.argument_size_in_bytes),
      "output_bytes_per_device": int(memory.output_size_in_bytes),
      "alias_bytes_per_device": int(memory.alias_size_in_bytes),
      "temp_bytes_per_device": int(memory.temp_size_in_bytes),
  }
  # Buffers that are never live together can share memory, so XLA's simulated peak is
  # below the sum of the allocations (which is the fallback where it is not reported).
  allocated = (out["argument_bytes_per_device"] + out["output_bytes_per_device"]
               - out["alias_bytes_per_device"] + out["temp_bytes_per_device"])
  out["allocated_bytes_per_device"] = allocated
  peak = int(getattr(memory, "peak_memory_in_bytes", 0) or 0)
  out["peak_bytes_per_device"] = peak if peak > 0 else allocated
  out["peak_source"] = "xla" if peak > 0 else "allocations"
  peak = out["peak_bytes_per_device"]
  if target.platform == "tpu":
    out.update(fits=True, fit_source="compiler")
  elif target.usable_hbm_bytes is not None:
    out.update(fits=peak <= target.usable_hbm_bytes, fit_source="estimate")
    if not out["fits"]:
      out["message"] = (f"estimate: {peak / GIB:.2f} GiB per device exceeds the "
                        f"{target.usable_hbm_bytes / GIB:.2f} GiB usable on {target.generation}")
  costs = compiled.cost_analysis()
  costs = costs[0] if isinstance(costs, (list, tuple)) else costs
  out["xla_flops_per_device"] = float(costs.get("flops", 0.0)) if costs else None
  summary = hlo.analyze(compiled.as_text())
  out["flops_per_device"] = summary.matmul_flops
  out["all_flops_per_device"] = summary.flops
  out["transcendentals_per_device"] = summary.transcendentals
  out["loop_trip_counts"] = summary.loops
  out["unknown_trip_counts"] = summary.unknown_trip_counts
  out["collectives"] = {k: dataclasses.asdict(v) for k, v in summary.collectives.items()}
  return out
