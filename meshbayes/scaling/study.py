"""A scaling study: the trainer's train step compiled ahead of time for each of some targets,
one JSON record per target and configuration, a markdown table and log-log plots.

``run_study`` compiles (``aot.compile_and_profile``) ``base`` for each target (weak
scaling: the batch per core held), or searches the widest fitting model per depth
(``search.largest_fit``), and writes the records as they come (partial results
survive), then the table and plots (``meshbayes.scaling.report``);
``from_json_tables`` recomputes the predicted step time tables of existing JSON
files without compiling. This module imports no JAX: call ``set_up_jax`` with the
targets before anything starts it.

Record fields (``aot.compile_and_profile``'s, with the study's ``command`` and
versions): ``target``, ``cores``, ``mesh``, ``batch_size``, ``input_length``,
``target_length``, ``variational_params``, ``deterministic_params``,
``argument_bytes_per_device``, ``output_bytes_per_device``,
``alias_bytes_per_device``, ``temp_bytes_per_device``, ``peak_bytes_per_device``
(arguments + outputs - aliased + temporaries), ``state_bytes_per_device`` (the sharding arithmetic),
``fits`` (``fit_source``: ``compiler`` or ``estimate``), ``message`` (the
compiler's when it does not fit), ``required_bytes_per_device`` (out of
memory), ``flops_per_device`` (matmul FLOPs per device per step, loops
unrolled), ``xla_flops_per_device`` (XLA's cost analysis, which counts a loop
body once), ``collectives`` (count, executed per step, bytes), and
``compile_seconds``; for TPU and GPU targets also ``collective_groups`` (each
collective's replica groups: mesh axes and torus links they span),
``hbm_bytes_per_device`` and ``operations_per_device`` (bytes the program's
operations move, and its kernels on a GPU; both from
``meshbayes.scaling.hlo_profile``) and
``roofline`` (the predicted step time on the target's generation,
``meshbayes.scaling.roofline``, on GPUs its frozen step-time model; the
markdown's "Predicted step time" table).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from meshbayes.runtime import strict_json
from meshbayes.scaling.targets import Target, prepare_libtpu

# The ``TransformerConfig`` fields a study may override, with their types.
OVERRIDES = (("emb_dim", int), ("num_heads", int), ("head_dim", int), ("mlp_dim", int),
             ("num_layers", int), ("num_encoder_layers", int), ("num_decoder_layers", int),
             ("vocab_size", int), ("dtype", str))


def records_text(records: Sequence[dict]) -> str:
  """The study's JSON: the records as strict JSON, each non-finite figure null with its
  reason under the record's ``null_reasons``; finite records as ``json.dumps`` writes them."""

  def strict(record: dict) -> dict:
    reasons: dict[str, str] = {}
    clean = strict_json.finite(record, reasons=reasons)
    return {**clean, strict_json.NULL_REASONS: reasons} if reasons else clean

  return json.dumps([strict(r) for r in records], indent=1, allow_nan=False)



def set_up_jax(targets: Sequence[Target]) -> None:
  """The environment JAX starts in for ``targets``: compile-only TPU or GPU devices, libtpu
  prepared, enough simulated CPU devices for the largest CPU target."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # TPU and GPU targets are compile-only devices
  if any(t.platform == "tpu" for t in targets):
    prepare_libtpu()
  simulated = [t.num_devices for t in targets if t.platform == "cpu"]
  if simulated:
    count = max(simulated)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
      os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()



def base_spec(options: Mapping[str, Any]) -> Any:
  """The study's step from its command line's options (``vars(args)``): the preset, the
  ``OVERRIDES`` given and ``remat``, ``estimators`` (``component=estimator,...``), batch,
  lengths, optimizer, microbatches, partitioning and model axis.

  Raises:
    ValueError: ``estimators`` is not a list of component=estimator pairs.
  """
  from meshbayes.scaling.aot import StepSpec
  overrides = {name: options[name] for name, _ in OVERRIDES if options.get(name) is not None}
  if options.get("remat") is not None:
    overrides["remat_policy"] = options["remat"]
  text = options.get("estimators", "")
  estimators = tuple(tuple(item.split("=")) for item in text.split(",") if item)
  if any(len(pair) != 2 for pair in estimators):
    raise ValueError(f"--estimators={text!r} must be component=estimator pairs")
  return StepSpec(model=options["model"], deterministic=options["deterministic"],
                  overrides=tuple(overrides.items()), estimators=estimators,
                  batch_size=options["batch_size"],
                  input_length=options["input_length"], target_length=options["target_length"],
                  optimizer=options["optimizer"], num_microbatches=options["num_microbatches"],
                  partitioning=options["partitioning"], model_parallel=options["model_parallel"])


def versions() -> dict[str, str]:
  """The installed versions of JAX, jaxlib, libtpu and JAX's CUDA plugin (those present)."""
  import importlib.metadata
  found = {}
  for package in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin"):
    try:
      found[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  return found



def differences(records: list[dict]) -> str:
  """Bayesian minus deterministic, per target, for records compiled in pairs."""
  from meshbayes.scaling.report import GIB, bytes_needed
  pairs: dict[str, dict[str, dict]] = {}
  for r in records:
    pairs.setdefault(r["target"], {})[r["estimators"]] = r
  header = ("| target | peak GiB det. | peak GiB Bayes | difference GiB | state GiB det. | "
            "state GiB Bayes | TFLOPs det. | TFLOPs Bayes | FLOP ratio |")
  lines = [header, "|---" * 9 + "|"]
  for target, pair in pairs.items():
    det, bayes = pair.get("deterministic"), pair.get("bayesian")
    if not det or not bayes:
      continue
    flops = lambda r: r.get("flops_per_device")
    ratio = (f"{flops(bayes) / flops(det):.3f}" if flops(det) and flops(bayes) else "-")
    fmt = lambda v, scale: "-" if v is None else f"{v / scale:.3f}"
    det_bytes, bayes_bytes = bytes_needed(det), bytes_needed(bayes)
    difference = bayes_bytes - det_bytes if det_bytes and bayes_bytes else None
    lines.append(f"| {target} | {fmt(det_bytes, GIB)} | {fmt(bayes_bytes, GIB)} "
                 f"| {fmt(difference, GIB)} | {fmt(det.get('state_bytes_per_device'), GIB)} "
                 f"| {fmt(bayes.get('state_bytes_per_device'), GIB)} | {fmt(flops(det), 1e12)} "
                 f"| {fmt(flops(bayes), 1e12)} | {ratio} |")
  return "\n".join(lines) + "\n"



def from_json_tables(paths: Sequence[str]) -> tuple[str, list[dict]]:
  """The predicted step time tables of existing study JSON files (nothing compiled), and
  their records.

  Raises:
    ValueError: a file cannot be read as a study's JSON, or holds no list of records.
  """
  from meshbayes.scaling import report
  text, everything = [], []
  for name in paths:
    path = Path(name)
    try:
      records = json.loads(path.read_text())
    except (OSError, ValueError) as error:
      raise ValueError(f"--from_json: cannot read {name!r} as a scaling-study JSON: "
                       f"{error}") from None
    if not isinstance(records, list):
      raise ValueError(f"--from_json: {name!r} holds no list of records")
    everything += records
    text += [f"## {path.name}: predicted step time (roofline)", "",
             report.roofline_table(records)]
  return "\n".join(text), everything


def weak_batch(batch_size: int, targets: Sequence[Target], target: Target,
               weak_scaling: bool = True) -> int:
  """The global batch on ``target``: ``batch_size`` on the first of ``targets``, scaled with
  the cores under weak scaling (the batch per core fixed).

  Raises:
    ValueError: the scaled batch is not a whole number of sequences.
  """
  if not weak_scaling:
    return batch_size
  scaled, remainder = divmod(batch_size * target.num_devices, targets[0].num_devices)
  if remainder:
    raise ValueError(f"--weak_scaling: --batch_size={batch_size} x {target.num_devices} / "
                     f"{targets[0].num_devices} cores is not a whole batch on {target.label}")
  return scaled


@dataclasses.dataclass(frozen=True)
class WidthSearch:
  """The widest fitting model per depth, searched instead of compiling ``base`` as it is
  (``search.largest_fit``; ``--search_*`` of the scaling_study command).

  Attributes:
    layers: the depths (encoder and decoder layers each) searched.
    step: width granularity of the family (``search.Family``).
    start_units: the first width tried, in ``step``s (None: the base's).
    bracket: two widths, in ``step``s, known to fit and not to fit (None: found).
    max_compiles: compiles per depth at most.
  """

  layers: tuple[int, ...]
  step: int = 256
  start_units: int | None = None
  bracket: tuple[int, ...] | None = None
  max_compiles: int = 6


def run_study(base: Any, targets: Sequence[Target], json_path: Path, markdown_path: Path,
              plot_path: Path, command: str, *, title: str = "",
              compare_deterministic: bool = False, weak_scaling: bool = False,
              width_search: WidthSearch | None = None) -> list[dict]:
  """Compiles ``base`` (and its deterministic twin when compared) for each target, or
  with ``width_search`` searches the widest fitting model for each of its depths; writes
  the records to ``json_path`` as they come, then the table and plots. ``command`` is
  recorded in each record and the table. Returns the records.

  Raises:
    ValueError: ``weak_scaling`` makes a batch that is not whole on some target.
  """
  import jax

  from meshbayes.scaling import aot, report, search

  json_path.parent.mkdir(parents=True, exist_ok=True)
  context = {"command": command, **{f"{k}_version": v for k, v in versions().items()}}
  records: list[dict] = []

  def compile_and_log(spec, target):
    record = aot.compile_and_profile(spec, target)
    record.update(context)
    records.append(record)
    json_path.write_text(records_text(records))  # partial results survive
    jax.clear_caches()
    return record

  summaries = []
  for target in targets:
    if width_search is not None:
      family = search.Family(base, step=width_search.step)
      for layers in width_search.layers:
        print(f"{target.label}: searching the widest model with {layers}+{layers} layers",
              flush=True)
        best, _ = search.largest_fit(family, target, layers, compile_and_log,
                                     start_units=width_search.start_units,
                                     bracket=width_search.bracket,
                                     max_compiles=width_search.max_compiles)
        summaries.append((target.label, layers, best))
      continue
    sized = base.replace(batch_size=weak_batch(base.batch_size, targets, target, weak_scaling))
    specs = [sized.replace(deterministic=False), sized.replace(deterministic=True)] \
        if compare_deterministic else [sized]
    for spec in specs:
      start = time.perf_counter()
      record = compile_and_log(spec, target)
      needed = report.bytes_needed(record)
      error = f" {record['error']}" if record["error"] else ""
      print(f"{target.label} {record['estimators']}: fits={record['fits']} "
            f"peak={'-' if needed is None else f'{needed / 2**30:.2f} GiB'} "
            f"flops={record.get('flops_per_device') or 0:.3e} "
            f"({time.perf_counter() - start:.0f} s){error}", flush=True)

  text = [f"# {title or 'Scaling study'}", "", f"`{command}`", "",
          report.markdown_table(records)]
  if compare_deterministic:
    text += ["## Bayesian minus deterministic", "", differences(records)]
  if any(r.get("roofline") for r in records):
    text += ["## Predicted step time (roofline)", "",
             "`meshbayes.scaling.roofline` on the generation's published peak rates "
             "(docs/performance.md; on GPUs its frozen step-time model); step, tokens/s, "
             "TFLOP/s and MFU: collectives hidden behind computation / not hidden.", "",
             report.roofline_table(records)]
  if summaries:
    text += ["## Largest fitting model per depth", ""]
    for label, layers, best in summaries:
      if best is None:
        text.append(f"- {label}, {layers}+{layers} layers: nothing fit")
      else:
        text.append(f"- {label}, {layers}+{layers} layers: d={best['emb_dim']}, "
                    f"{best['num_heads']} heads, ff={best['mlp_dim']}: "
                    f"{best['variational_params'] / 1e9:.2f}B variational parameters, "
                    f"peak {best['peak_bytes_per_device'] / 2**30:.2f} GiB per device"
                    f"{'' if best.get('bracketed') else ' (next width up not compiled)'}")
  markdown_path.write_text("\n".join(text) + "\n")
  plot = report.plot if width_search is None else report.plot_search
  plotted = plot(records, plot_path, title)
  print(f"wrote {json_path}, {markdown_path}" + (f", {plotted}" if plotted else ""))
  return records
