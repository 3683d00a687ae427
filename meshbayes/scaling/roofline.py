"""Predicted step time of a compiled train step on a TPU slice or GPUs: a roofline model.

``predict`` turns a scaling-study record (``aot.compile_step``, richer where
``hlo_profile`` read its HLO) into compute, HBM and communication seconds at
``HARDWARE``'s published rates, the step time (``overlap="max"``: collectives hidden;
``"sum"``: not), throughput and MFU; on GPUs the local time is a frozen step-time
model's: ``FROZEN_GPU_MODEL`` (v1, the default) or ``FROZEN_GPU_MODEL_V2`` (cuDNN's fused
attention at its measured rate, provisional). docs/performance.md states the models, their
assumptions and their sources.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from meshbayes.field_checks import positive_int, positive_ints
from meshbayes.scaling import hlo

OVERLAPS = ("max", "sum")
KINDS = hlo.COLLECTIVES


@dataclasses.dataclass(frozen=True)
class Hardware:
  """Published peak rates of one TPU generation or GPU (links: NVLink for GPUs).

  Attributes:
    generation: ``v2``, ``v3``, ``v4``, ``v5e`` or ``v5p`` (the target names' prefix),
      ``h100`` (SXM) or ``h200``.
    peak_flops_per_chip: peak dense bf16 matmul FLOP/s of one chip.
    hbm_bytes_per_second_per_chip: HBM bandwidth of one chip.
    ici_link_bytes_per_second: bandwidth of one inter-chip link in one direction.
    ici_links_per_chip: links per chip (4 on a 2-D torus, 6 on a 3-D one).
    devices_per_chip: JAX devices per chip (2 cores on v2 and v3; 1 megacore
      device on v4 and v5p; 1 core on v5e), which share the chip's links.
    wraparound_multiple: a torus dimension of the slice closes into a ring
      (wraparound links) when its length in chips is a multiple of this.
    source: where the numbers come from.
  """

  generation: str
  peak_flops_per_chip: float
  hbm_bytes_per_second_per_chip: float
  ici_link_bytes_per_second: float
  ici_links_per_chip: int
  devices_per_chip: int
  wraparound_multiple: int
  source: str

  def __post_init__(self):
    if not isinstance(self.generation, str) or not self.generation:
      raise ValueError(f"Hardware: generation={self.generation!r} must be a non-empty name")
    for name in ("peak_flops_per_chip", "hbm_bytes_per_second_per_chip",
                 "ici_link_bytes_per_second"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
          or math.isinf(value):
        raise ValueError(f"Hardware {self.generation}: {name}={value!r} must be a positive "
                         "finite number")
    positive_ints(f"Hardware {self.generation}", self, "ici_links_per_chip", "devices_per_chip",
                  "wraparound_multiple")
    if not isinstance(self.source, str) or not self.source.strip():
      raise ValueError(f"Hardware {self.generation}: source={self.source!r} must cite where "
                       "the numbers come from")

  @property
  def is_gpu(self) -> bool:
    return self.generation in GPU_GENERATIONS

  @property
  def peak_flops_per_device(self) -> float:
    return self.peak_flops_per_chip / self.devices_per_chip

  @property
  def hbm_bytes_per_second_per_device(self) -> float:
    return self.hbm_bytes_per_second_per_chip / self.devices_per_chip

  def wraps(self, chips: int) -> bool:
    """Whether a torus dimension of ``chips`` chips has wraparound links (closes a ring)."""
    return chips > 2 and chips % self.wraparound_multiple == 0


GPU_GENERATIONS = ("h100", "h200")
_JOUPPI_2020 = ("Jouppi et al., 'A Domain-Specific Supercomputer for Training Deep Neural "
                "Networks', CACM 63(7), 2020, doi:10.1145/3360307, Table 3 (Google's Cloud "
                "TPU system-architecture page refers to it for v2 and v3)")
# Google Cloud's 'all-reduce bandwidth per Pod' is chips x links x one-way link bandwidth
# (v3: 1024 x 4 x 83 GB/s = 340 TB/s; v4: 4096 x 6 x 45 GB/s = 1.1 PB/s; v5e: 256 x 4 x
# 50 GB/s = 51.2 TB/s), which gives the per-link figures where no per-chip one is published.
HARDWARE: dict[str, Hardware] = {
    "v2": Hardware(
        "v2", peak_flops_per_chip=45e12, hbm_bytes_per_second_per_chip=700e9,
        ici_link_bytes_per_second=496e9 / 8, ici_links_per_chip=4, devices_per_chip=2,
        wraparound_multiple=16,
        source="peak: Google, 180 TFLOP/s per 4-chip Cloud TPU v2 board and 11.5 PFLOP/s per "
               "256-chip pod (Google I/O 2017), i.e. 45 per chip (1 MXU of 128x128 MACs per "
               "core at 700 MHz: 45.9); HBM 700 GB/s per chip and ICI 4 links x 496 Gbit/s "
               "per direction: " + _JOUPPI_2020 + "; 16x16-chip pod, a 2-D torus"),
    "v3": Hardware(
        "v3", peak_flops_per_chip=123e12, hbm_bytes_per_second_per_chip=900e9,
        ici_link_bytes_per_second=340e12 / (1024 * 4), ici_links_per_chip=4,
        devices_per_chip=2, wraparound_multiple=32,
        source="https://cloud.google.com/tpu/docs/v3 (123 TFLOP/s bf16, HBM 900 GB/s per "
               "chip; 1024-chip 2-D torus pod, all-reduce bandwidth 340 TB/s per pod = 83 GB/s "
               "per link and direction; " + "Jouppi et al. 2020 give 4 x 656 Gbit/s)"),
    "v4": Hardware(
        "v4", peak_flops_per_chip=275e12, hbm_bytes_per_second_per_chip=1200e9,
        ici_link_bytes_per_second=1.1e15 / (4096 * 6), ici_links_per_chip=6,
        devices_per_chip=1, wraparound_multiple=4,
        source="https://cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, HBM 1200 GB/s per "
               "chip; 4096-chip 3-D torus pod, all-reduce bandwidth 1.1 PB/s per pod = 45 GB/s "
               "per link and direction); wraparound on multiples of a 4x4x4 cube: "
               "https://jax-ml.github.io/scaling-book/tpus"),
    "v5e": Hardware(
        "v5e", peak_flops_per_chip=197e12, hbm_bytes_per_second_per_chip=819e9,
        ici_link_bytes_per_second=400e9 / 4 / 2, ici_links_per_chip=4, devices_per_chip=1,
        wraparound_multiple=16,
        source="https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, HBM 819 GB/s, "
               "bidirectional ICI 400 GB/s per chip over 4 ports = 50 GB/s per link and "
               "direction; 16x16-chip 2-D torus pod)"),
    "v5p": Hardware(
        "v5p", peak_flops_per_chip=459e12, hbm_bytes_per_second_per_chip=2765e9,
        ici_link_bytes_per_second=1200e9 / 6 / 2, ici_links_per_chip=6, devices_per_chip=1,
        wraparound_multiple=4,
        source="https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, HBM 2765 GB/s, "
               "bidirectional ICI 1200 GB/s per chip over 6 links = 100 GB/s per link and "
               "direction; 3-D torus); wraparound on multiples of a 4x4x4 cube: "
               "https://jax-ml.github.io/scaling-book/tpus"),
    # GPUs: NVLink 4 through NVSwitch gives each GPU 450 GB/s out and 450 in (18 links of
    # 25 GB/s per direction), to any peer. Modelled as a ring that always closes
    # (wraparound_multiple 1) on one 225 GB/s link per direction: 450 GB/s per device on
    # rings of three or more GPUs; a pair is under-rated by half.
    "h100": Hardware(
        "h100", peak_flops_per_chip=989e12, hbm_bytes_per_second_per_chip=3.35e12,
        ici_link_bytes_per_second=225e9, ici_links_per_chip=1, devices_per_chip=1,
        wraparound_multiple=1,
        source="https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 1,979 TFLOP/s bf16 "
               "with sparsity, 989 dense; HBM3 3.35 TB/s; NVLink 900 GB/s bidirectional)"),
    "h200": Hardware(
        "h200", peak_flops_per_chip=989e12, hbm_bytes_per_second_per_chip=4.8e12,
        ici_link_bytes_per_second=225e9, ici_links_per_chip=1, devices_per_chip=1,
        wraparound_multiple=1,
        source="https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 1,979 TFLOP/s bf16 "
               "with sparsity, 989 dense; HBM3e 4.8 TB/s; NVLink 900 GB/s bidirectional)"),
}


@dataclasses.dataclass(frozen=True)
class AttentionRate:
  """cuDNN's fused attention measured alone: one call's forward and backward at one shape.

  Attributes:
    head_width: features per head.
    batch: sequences.
    heads: attention heads.
    length: queries and keys per sequence.
    seconds: the measured forward and backward of one call.
    generation: the GPU it was measured on (``HARDWARE``'s key).
  """

  head_width: int
  batch: int
  heads: int
  length: int
  seconds: float
  generation: str = "h200"

  def __post_init__(self):
    positive_ints("AttentionRate", self, "head_width", "batch", "heads", "length")
    if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) \
        or not 0 < self.seconds < math.inf:
      raise ValueError(f"AttentionRate: seconds={self.seconds!r} must be a positive finite "
                       "number")
    if self.generation not in HARDWARE:
      raise ValueError(f"AttentionRate: generation={self.generation!r} is not one of "
                       f"{', '.join(HARDWARE)}")

  @property
  def flops(self) -> float:
    """The call's matmul FLOPs as ``hlo`` counts a fused attention's: two forward matmuls
    and five backward of ``2 x batch x heads x length x length x head_width`` each (no
    discount for a causal mask)."""
    return 7 * 2.0 * self.batch * self.heads * self.length ** 2 * self.head_width

  @property
  def fraction_of_peak(self) -> float:
    """The measured FLOP/s over the dense bf16 peak of the GPU it ran on."""
    return self.flops / self.seconds / HARDWARE[self.generation].peak_flops_per_device


@dataclasses.dataclass(frozen=True)
class GpuStepModel:
  """A GPU step's local seconds: ``matmul FLOPs / (matmul_fraction_of_peak x peak) + other
  operations' bytes / HBM bandwidth + kernels x seconds_per_kernel``.

  With ``fused_attention`` rates, cuDNN's fused-attention calls (a record's
  ``fused_attention_per_device``, ``scaling.fused_attention.census``) leave the matmul and
  kernel terms and take each call's FLOPs at ``attention_fraction_of_peak`` of the peak
  for its head width instead.

  Attributes:
    matmul_fraction_of_peak: the share of the dense bf16 peak the matmuls reach.
    seconds_per_kernel: what each kernel costs beyond its FLOPs and bytes (launch, tail,
      kernels too small to fill the GPU).
    source: where the constants come from.
    fused_attention: the fused attention's measured rates, distinct head widths in
      increasing order; none (v1): it is charged as any matmul.
  """

  matmul_fraction_of_peak: float
  seconds_per_kernel: float
  source: str
  fused_attention: tuple[AttentionRate, ...] = ()

  def __post_init__(self):
    if not 0 < self.matmul_fraction_of_peak <= 1:
      raise ValueError(f"GpuStepModel: matmul_fraction_of_peak={self.matmul_fraction_of_peak!r}"
                       " must be in (0, 1]")
    if not self.seconds_per_kernel >= 0:
      raise ValueError(f"GpuStepModel: seconds_per_kernel={self.seconds_per_kernel!r} must be "
                       ">= 0")
    if not isinstance(self.source, str) or not self.source.strip():
      raise ValueError("GpuStepModel: source must cite where the constants come from")
    widths = [rate.head_width for rate in self.fused_attention]
    if widths != sorted(set(widths)):
      raise ValueError(f"GpuStepModel: fused_attention head widths {widths} must be distinct "
                       "and in increasing order")

  def attention_fraction_of_peak(self, head_width: int) -> float:
    """The share of the peak a fused-attention call of ``head_width`` reaches.

    The rule: the measured rate of that head width; between two measured widths, the
    rate interpolated linearly in head width; below the narrowest or above the widest,
    the nearest measured rate. Batch, heads and length do not move it (not measured).

    >>> [round(FROZEN_GPU_MODEL_V2.attention_fraction_of_peak(w), 4) for w in (32, 64, 96, 128)]
    [0.0504, 0.0504, 0.0877, 0.125]
    """
    if not self.fused_attention:
      raise ValueError("GpuStepModel: this model has no fused_attention rates (v1 charges "
                       "fused attention as any matmul)")
    positive_int("GpuStepModel", "head_width", head_width)
    rates = self.fused_attention
    if head_width <= rates[0].head_width:
      return rates[0].fraction_of_peak
    if head_width >= rates[-1].head_width:
      return rates[-1].fraction_of_peak
    low, high = next((a, b) for a, b in zip(rates, rates[1:]) if head_width <= b.head_width)
    share = (head_width - low.head_width) / (high.head_width - low.head_width)
    return low.fraction_of_peak + share * (high.fraction_of_peak - low.fraction_of_peak)


# Frozen: later GPU goals are judged by these constants; change them only with a new
# measurement and the same check (tests/scaling/test_gpu_step_model.py).
FROZEN_GPU_MODEL = GpuStepModel(
    matmul_fraction_of_peak=0.475, seconds_per_kernel=2.0e-6,
    source="fitted on two steps measured on one NVIDIA H200 on 2026-11-26 (shared measurement "
           "h200-2026-11: JAX 0.11.2, commit 56c213e, bf16, one device): base deterministic, "
           "32 x 256, no remat, 0.0809 s and paper deterministic, 8 x 256, full remat, 0.1615 s, "
           "with matmul FLOPs, HBM bytes and kernels read from their optimized HLO; it predicted "
           "the two Bayesian steps within 2.5% and deviceless compiles of the same code within "
           "5.3% (docs/performance.md)")

# v2: v1's constants, and cuDNN's fused attention (``__cudnn$fmha*``, forward and backward)
# at the rate measured alone on the H200. Provisional until a measured gpu.gin step with
# fused attention is within 10% of it (tools/gpu_check.py --plan=v2 measures one first);
# no measured step so far has a fused-attention call, so on every one of them v2 is v1.
FROZEN_GPU_MODEL_V2 = GpuStepModel(
    matmul_fraction_of_peak=0.475, seconds_per_kernel=2.0e-6,
    fused_attention=(AttentionRate(head_width=64, batch=32, heads=12, length=256,
                                   seconds=0.452e-3),
                     AttentionRate(head_width=128, batch=8, heads=128, length=256,
                                   seconds=0.973e-3)),
    source="v1's matmul and kernel constants; cuDNN's fused attention (causal, relative-position "
           "bias, bf16, no dropout), forward and backward of one call, measured alone on one "
           "NVIDIA H200 on 2026-11-27 (JAX 0.11.2; docs/results/2026-11-27-gpu.md, 'Attention "
           "alone'): 0.452 ms at base's 32 x 256, 12 heads of 64, and 0.973 ms at paper's "
           "8 x 256, 128 heads of 128; provisional until a measured gpu.gin step with fused "
           "attention is within 10%")

# The frozen models by the names tables and tools give them.
GPU_MODELS = {"v1": FROZEN_GPU_MODEL, "v2": FROZEN_GPU_MODEL_V2}


def gpu_model(name: str) -> GpuStepModel:
  """The frozen GPU model of a name (``v1``, ``v2``), with one clear error for another."""
  if name not in GPU_MODELS:
    raise ValueError(f"roofline: gpu model {name!r} is not one of {', '.join(GPU_MODELS)}")
  return GPU_MODELS[name]


def hardware(generation: str) -> Hardware:
  """The ``HARDWARE`` entry of a generation, with one clear error for an unknown name."""
  if generation not in HARDWARE:
    raise ValueError(f"roofline: generation={generation!r} is not one of "
                     f"{', '.join(HARDWARE)}")
  return HARDWARE[generation]


# ----------------------------------------------------------------------------------------
# Collectives on a torus.

@dataclasses.dataclass(frozen=True)
class TorusSpan:
  """How a replica group lies along one torus dimension of the slice.

  Attributes:
    chips: distinct positions of the group's chips along the dimension.
    stride: distance in links between neighbouring members (groups interleave).
    slice_chips: the slice's length along the dimension (decides wraparound).
  """

  chips: int
  stride: int
  slice_chips: int

  def __post_init__(self):
    positive_ints("TorusSpan", self, "chips", "stride", "slice_chips")


def ring_factor(kind: str, group_size: int) -> float:
  """Bytes each device sends, in units of the collective's per-device result bytes.

  Bandwidth-optimal ring algorithms over ``n`` devices (docs/performance.md, "Collectives
  on the torus"): an all-reduce ``2(n-1)/n``, an all-gather ``(n-1)/n``, a reduce-scatter
  ``n-1`` (its result is the shard), an all-to-all ``n/4``, a collective-permute 1.

  >>> ring_factor("all-reduce", 4), ring_factor("all-gather", 4), ring_factor("all-reduce", 1)
  (1.5, 0.75, 0.0)
  """
  if kind not in KINDS:
    raise ValueError(f"roofline: collective kind={kind!r} is not one of {', '.join(KINDS)}")
  positive_int("roofline", "group_size", group_size)
  n = group_size
  if n == 1:
    return 0.0
  return {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": n - 1.0,
          "all-to-all": n / 4, "collective-permute": 1.0}[kind]


def ring_bandwidth(hw: Hardware, spans: Sequence[TorusSpan]) -> float:
  """Bytes per second one device can send on the rings of the torus dimensions ``spans`` covers.

  Two links per wrapped dimension the group covers, else one, each shared ``stride`` ways;
  dimensions add; the chip's devices share its links (docs/performance.md). No span (the
  group lives on one chip) is infinitely fast: on-chip transfers are left out.

  >>> hw = HARDWARE["v2"]
  >>> ring_bandwidth(hw, [TorusSpan(16, 1, 16)]) == hw.ici_link_bytes_per_second
  True
  """
  total = 0.0
  for span in spans:
    closed = hw.wraps(span.slice_chips) and span.chips * span.stride == span.slice_chips
    total += (2 if closed else 1) * hw.ici_link_bytes_per_second / span.stride
  return total / hw.devices_per_chip if total else math.inf


def collective_seconds(kind: str, bytes_per_device: float, group_size: int,
                       bandwidth: float) -> float:
  """Seconds of one collective (or a sum of like ones): ``ring_factor x bytes / bandwidth``.

  Bandwidth-bound: per-hop latency (about a microsecond) is left out.

  >>> collective_seconds("all-reduce", 1e9, 8, 1e11)  # 2 * 7/8 * 1e9 / 1e11
  0.0175
  """
  if not bytes_per_device >= 0:
    raise ValueError(f"roofline: bytes_per_device={bytes_per_device!r} must be >= 0")
  if not bandwidth > 0:
    raise ValueError(f"roofline: bandwidth={bandwidth!r} must be > 0 bytes/s")
  factor = ring_factor(kind, group_size)
  return 0.0 if factor == 0 or bytes_per_device == 0 else factor * bytes_per_device / bandwidth


# ----------------------------------------------------------------------------------------
# The prediction.

@dataclasses.dataclass(frozen=True)
class Prediction:
  """A record's predicted step on one TPU generation (all times per step, in seconds).

  Attributes:
    generation: the hardware.
    overlap: ``max`` (communication hidden behind computation) or ``sum``.
    compute_seconds: matmul FLOPs at peak.
    memory_seconds: HBM time beyond ``compute_seconds`` (None: the record has
      no HBM profile, and the memory term is left out).
    communication_seconds: the collectives.
    communication_by_axis: the same split by the mesh axes the groups span
      (``data``, ``model``, ``data+model``; ``unknown`` where not known).
    step_seconds: the combination that ``overlap`` names.
    kernel_seconds: on GPUs, the frozen model's cost of the kernels (else None).
    attention_seconds: with a model that charges fused attention at its own rate (v2),
      the fused-attention calls' share of ``compute_seconds`` (else None).
    tokens_per_second: encoder and decoder tokens of the global batch per second.
    tflops_per_second: model FLOP/s of the whole slice, in units of 1e12.
    mfu: model FLOPs per device over (step time x peak per device).
    communication_model: ``replica groups`` or the fallback assumption used.
  """

  generation: str
  overlap: str
  compute_seconds: float
  memory_seconds: float | None
  communication_seconds: float
  communication_by_axis: dict[str, float]
  step_seconds: float
  tokens_per_second: float
  tflops_per_second: float
  mfu: float
  communication_model: str
  kernel_seconds: float | None = None
  attention_seconds: float | None = None

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


FALLBACK_ASSUMPTION = ("fallback: every collective on the data axis, over one torus dimension "
                       "with wraparound")


def _communication(record: Mapping[str, Any], hw: Hardware) -> tuple[dict[str, float], str]:
  """Seconds of the record's collectives by mesh axis, and which model gave them.

  With replica groups (``hlo_profile.program_profile``), each group's own size and torus
  spans; a group without spans (a CPU mesh has no chip coordinates) gets one
  wrapped torus dimension. Without replica groups, ``FALLBACK_ASSUMPTION``.
  """
  by_axis: dict[str, float] = defaultdict(float)
  groups = record.get("collective_groups")
  if groups is not None:
    for g in groups:
      spans = [TorusSpan(*span) for span in g["torus_spans"]] if g.get("torus_spans") \
          is not None else None
      bandwidth = ring_bandwidth(hw, spans) if spans is not None else \
          2 * hw.ici_link_bytes_per_second / hw.devices_per_chip
      seconds = 0.0 if math.isinf(bandwidth) else collective_seconds(
          g["kind"], g["executed_bytes"], g["group_size"], bandwidth)
      by_axis["+".join(g["mesh_axes"]) if g.get("mesh_axes") else "unknown"] += seconds
    return dict(by_axis), "replica groups"
  # Records compiled before replica groups were kept: the simplification.
  n = int((record.get("mesh") or {}).get("data") or record.get("cores") or 1)
  bandwidth = 2 * hw.ici_link_bytes_per_second / hw.devices_per_chip
  for kind, entry in (record.get("collectives") or {}).items():
    if kind in KINDS:
      by_axis["unknown"] += collective_seconds(kind, entry["executed_bytes"], n, bandwidth)
  return dict(by_axis), FALLBACK_ASSUMPTION


def predict(record: Mapping[str, Any], hardware_spec: Hardware | None = None,
            overlap: str = "max", gpu_model: GpuStepModel | None = FROZEN_GPU_MODEL
            ) -> Prediction:
  """The roofline prediction of a compiled record's step.

  Args:
    record: a scaling-study record that compiled (``flops_per_device`` set).
    hardware_spec: the chip; default ``HARDWARE[record["generation"]]``.
    overlap: ``max`` or ``sum`` (see the module docstring).
    gpu_model: on a GPU, the model of its local time (default v1; None: the bare
      roofline). A model with ``fused_attention`` rates (v2) reads the record's
      ``fused_attention_per_device``.

  Raises:
    ValueError: an unknown overlap or generation, a record that did not compile, or a
      GPU model asked of a record without ``operations_per_device`` (v2: without
      ``fused_attention_per_device``).

  >>> record = {"generation": "v2", "cores": 8, "flops_per_device": 22.5e12,
  ...           "model_flops_per_device": 22.5e12, "batch_size": 8, "input_length": 256,
  ...           "target_length": 256, "collectives": {}}
  >>> p = predict(record, overlap="max")
  >>> round(p.compute_seconds, 6), round(p.step_seconds, 6), round(p.mfu, 3)
  (1.0, 1.0, 1.0)
  """
  if overlap not in OVERLAPS:
    raise ValueError(f"roofline: overlap={overlap!r} must be one of {', '.join(OVERLAPS)}")
  flops = record.get("flops_per_device")
  if not flops:
    raise ValueError(f"roofline: record for target {record.get('target')!r} has no "
                     "flops_per_device (it did not compile); nothing to predict")
  hw = hardware_spec if hardware_spec is not None else hardware(record.get("generation"))
  bandwidth = hw.hbm_bytes_per_second_per_device
  profile = record.get("hbm_bytes_per_device")
  kernel_seconds = attention_seconds = None
  if hw.is_gpu and gpu_model is not None:
    operations = _operations(record)
    attention = _fused_attention(record, gpu_model, hw)
    compute = (flops - attention.flops) / (
        gpu_model.matmul_fraction_of_peak * hw.peak_flops_per_device) + attention.seconds
    memory = sum(entry["bytes"] for kind, entry in operations.items() if kind != "matmul") \
        / bandwidth
    kernel_seconds = gpu_model.seconds_per_kernel * (
        sum(entry["executed"] for entry in operations.values()) - attention.calls)
    attention_seconds = attention.seconds if gpu_model.fused_attention else None
  else:
    compute = flops / hw.peak_flops_per_device
    memory = None
    if profile:
      memory = (max(0.0, profile["matmul_ops"] / bandwidth - compute)
                + profile["other_ops"] / bandwidth)
  by_axis, model = _communication(record, hw)
  communication = sum(by_axis.values())
  local = compute + (memory or 0.0) + (kernel_seconds or 0.0)
  step = max(local, communication) if overlap == "max" else local + communication
  model_flops = record.get("model_flops_per_device") or flops
  tokens = record["batch_size"] * (record["input_length"] + record["target_length"])
  return Prediction(
      generation=hw.generation, overlap=overlap, compute_seconds=compute, memory_seconds=memory,
      communication_seconds=communication, communication_by_axis=by_axis, step_seconds=step,
      tokens_per_second=tokens / step,
      tflops_per_second=model_flops * record["cores"] / step / 1e12,
      mfu=model_flops / (step * hw.peak_flops_per_device), communication_model=model,
      kernel_seconds=kernel_seconds, attention_seconds=attention_seconds)


def predictions(record: Mapping[str, Any], gpu_model: GpuStepModel | None = FROZEN_GPU_MODEL
                ) -> dict[str, dict[str, Any]] | None:
  """Both overlaps for the record's own generation, as JSON; None when there is none to make."""
  if not record.get("flops_per_device") or record.get("generation") not in HARDWARE:
    return None
  return {overlap: predict(record, overlap=overlap, gpu_model=gpu_model).as_dict()
          for overlap in OVERLAPS}


def _operations(record: Mapping[str, Any]) -> Mapping[str, Any]:
  operations = record.get("operations_per_device")
  if not operations:
    raise ValueError(f"roofline: record for target {record.get('target')!r} has no "
                     "operations_per_device (hlo_profile.program_profile has not read its HLO)")
  return operations


@dataclasses.dataclass(frozen=True)
class _Attention:
  flops: float = 0.0
  seconds: float = 0.0
  calls: float = 0.0


def _fused_attention(record: Mapping[str, Any], gpu_model: GpuStepModel, hw: Hardware
                     ) -> _Attention:
  """The fused-attention calls' FLOPs, seconds at the model's rates and count, per step;
  nothing for a model without rates (v1 charges them as any matmul)."""
  if not gpu_model.fused_attention:
    return _Attention()
  calls = record.get("fused_attention_per_device")
  if calls is None:
    raise ValueError(f"roofline: record for target {record.get('target')!r} has no "
                     "fused_attention_per_device, which a model with fused_attention rates "
                     "(v2) charges (scaling.fused_attention.census reads it from the HLO)")
  return _Attention(
      flops=sum(c["executed"] * c["flops"] for c in calls),
      seconds=sum(c["executed"] * c["flops"] / (
          gpu_model.attention_fraction_of_peak(c["head_width"]) * hw.peak_flops_per_device)
          for c in calls),
      calls=sum(c["executed"] for c in calls))


def seconds_by_kind(record: Mapping[str, Any], hardware_spec: Hardware | None = None,
                    gpu_model: GpuStepModel | None = FROZEN_GPU_MODEL) -> dict[str, float]:
  """A profiled record's predicted compute and HBM time split by ``hlo_profile.WORK_KINDS``.

  The bare roofline: the matmuls take their FLOPs at peak or their bytes at HBM
  bandwidth, whichever is longer; every other kind its bytes at HBM bandwidth
  (collectives: their HBM reads and writes, not the link time). On a GPU with
  ``gpu_model``: the matmuls their FLOPs at the model's share of the peak (v2: the
  fused-attention calls at their own rate, in ``matmul``), every other kind its bytes,
  and each kind its kernels' cost. The kinds add up to ``predict``'s local time
  (compute, memory and kernels).
  """
  hw = hardware_spec if hardware_spec is not None else hardware(record.get("generation"))
  operations = _operations(record)
  bandwidth = hw.hbm_bytes_per_second_per_device
  seconds = {kind: entry["bytes"] / bandwidth for kind, entry in operations.items()}
  if hw.is_gpu and gpu_model is not None:
    attention = _fused_attention(record, gpu_model, hw)
    seconds["matmul"] = (record["flops_per_device"] - attention.flops) / (
        gpu_model.matmul_fraction_of_peak * hw.peak_flops_per_device) + attention.seconds \
        - gpu_model.seconds_per_kernel * attention.calls
    return {kind: value + gpu_model.seconds_per_kernel * operations[kind]["executed"]
            for kind, value in seconds.items()}
  seconds["matmul"] = max(record["flops_per_device"] / hw.peak_flops_per_device,
                          seconds["matmul"])
  return seconds
