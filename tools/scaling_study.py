"""Compile the trainer's train step for TPU topologies, NVIDIA GPUs or simulated CPU meshes,
and report per-device memory, fit, FLOPs and collectives.

The step is the one ``meshbayes.train`` runs (``StepFunctions.train_step``
jitted by ``train_step.jit_train_step`` with the partitioner's shardings and a
donated state), compiled ahead of time: no TPU or GPU needed, only libtpu (the
``tpu`` extra) for TPU targets and JAX's CUDA plugin (the ``gpu-aot`` extra, in
a venv of its own) for GPU targets (``h100:1``, ``h200:8``); ``--target=cpu``
compiles for simulated CPU meshes of the same sizes and estimates the fit
against the TPU's or GPU's memory.

  python -m meshbayes.tools.scaling_study --model=paper --topologies=v2:2x2,v2:4x4,v2:8x8,v2:16x16 \\
    --json=docs/scaling/paper_v2.json
  python -m meshbayes.tools.scaling_study --model=tiny --topologies=v2:2x2,v2:4x4 --target=cpu \\
    --batch_size=32 --input_length=16 --target_length=16 --json=/tmp/tiny.json
  python -m meshbayes.tools.scaling_study --model=paper --topologies=v2:16x16 --remat=full \\
    --search_layers=6,12,24 --json=docs/scaling/search_v2.json     # largest fitting model
  python -m meshbayes.tools.scaling_study --from_json docs/scaling/paper_v2.json  # predictions only
  python -m meshbayes.tools.scaling_study --model=paper --topologies=h200:1 --partitioning=data_only \\
    --batch_size=8 --dtype=bfloat16 --remat=none --compare_deterministic --json=runs/h200.json

Writes the JSON (a list, one record per target and configuration), a
markdown table (``--markdown``, default next to the JSON) and log-log plots
of per-device memory and FLOPs against cores (``--plot``, default next to the
JSON). Record fields: ``target``, ``cores``, ``mesh``, ``batch_size``,
``input_length``, ``target_length``, ``variational_params``,
``deterministic_params``, ``argument_bytes_per_device``,
``output_bytes_per_device``, ``alias_bytes_per_device``,
``temp_bytes_per_device``, ``peak_bytes_per_device`` (arguments + outputs -
aliased + temporaries), ``state_bytes_per_device`` (the sharding arithmetic),
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
``--from_json`` recomputes that table from existing JSON files without compiling.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Only what parses names and writes JSON: the environment must be set before JAX starts.
from meshbayes.runtime import strict_json
from meshbayes.scaling.targets import parse_targets, prepare_libtpu

_OVERRIDES = (("emb_dim", int), ("num_heads", int), ("head_dim", int), ("mlp_dim", int),
              ("num_layers", int), ("num_encoder_layers", int), ("num_decoder_layers", int),
              ("vocab_size", int), ("dtype", str))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="paper", help="size preset (tiny ... paper, 10b)")
  parser.add_argument("--topologies",
                      help="comma-separated targets: v2:2x2, v3:4x4, v4:8x8x8, v5e:16x16, "
                           "v5p:4x8x8, h100:N, h200:N (N <= 8), or cpu:N")
  parser.add_argument("--target", choices=("tpu", "gpu", "cpu"), default=None,
                      help="compile for the names' own devices (TPU topologies with libtpu, "
                           "GPUs with JAX's CUDA plugin: the default) or simulated CPU meshes")
  parser.add_argument("--partitioning", default="fsdp_tp",
                      help="rule preset: data_only, megatron, fsdp_tp")
  parser.add_argument("--model_parallel", type=int, default=8,
                      help="model mesh axis size (capped at the device count)")
  parser.add_argument("--deterministic", action="store_true", help="the deterministic twin")
  parser.add_argument("--compare_deterministic", action="store_true",
                      help="compile the Bayesian model and its deterministic twin per target")
  parser.add_argument("--estimators", default="",
                      help="per-component estimators, e.g. mlp=deterministic,attention=flipout "
                           "(components: attention, cross_attention, mlp, embedding, logits)")
  parser.add_argument("--batch_size", type=int, default=256, help="global batch (sequences)")
  parser.add_argument("--weak_scaling", action="store_true",
                      help="--batch_size is the first topology's batch; the others scale it with "
                           "their core count (batch per core fixed)")
  parser.add_argument("--input_length", type=int, default=256)
  parser.add_argument("--target_length", type=int, default=256)
  parser.add_argument("--optimizer", default="adamw", help="adamw, adafactor, sgd or ivon (ivon with --deterministic)")
  parser.add_argument("--remat", choices=("none", "full", "minimal"), default=None,
                      help="rematerialization policy (default: the preset's)")
  parser.add_argument("--num_microbatches", type=int, default=1)
  for name, kind in _OVERRIDES:
    parser.add_argument(f"--{name}", type=kind, default=None, help="override the preset")
  parser.add_argument("--search_layers", default="",
                      help="search the widest fitting model (the preset's proportions) for each "
                           "of these depths, e.g. 6,12,24")
  parser.add_argument("--search_step", type=int, default=256, help="width granularity")
  parser.add_argument("--search_start", type=int, default=None,
                      help="first width to try, in units of --search_step")
  parser.add_argument("--search_bracket", default="",
                      help="FIT,MISS: widths (units) an earlier search found to fit and not to "
                           "fit; bisect between them without compiling them again")
  parser.add_argument("--search_max_compiles", type=int, default=6,
                      help="most compiles per target and depth")
  parser.add_argument("--json", help="output JSON")
  parser.add_argument("--markdown", default=None, help="output table (default: JSON's .md)")
  parser.add_argument("--plot", default=None, help="output plot (default: JSON's .png)")
  parser.add_argument("--title", default="", help="title of the plot and table")
  parser.add_argument("--from_json", nargs="+", default=None, metavar="JSON",
                      help="compile nothing: print (or write to --markdown) the predicted step "
                           "time table of these study JSON files")
  args = parser.parse_args(argv)
  if args.from_json is None and (not args.topologies or not args.json):
    parser.error("--topologies and --json are required (unless --from_json)")
  return args


def records_text(records: Sequence[dict]) -> str:
  """The study's JSON: the records as strict JSON, each non-finite figure null with its
  reason under the record's ``null_reasons``; finite records as ``json.dumps`` writes them."""

  def strict(record: dict) -> dict:
    reasons: dict[str, str] = {}
    clean = strict_json.finite(record, reasons=reasons)
    return {**clean, strict_json.NULL_REASONS: reasons} if reasons else clean

  return json.dumps([strict(r) for r in records], indent=1, allow_nan=False)


def _set_up_jax(targets) -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # TPU and GPU targets are compile-only devices
  if any(t.platform == "tpu" for t in targets):
    prepare_libtpu()
  simulated = [t.num_devices for t in targets if t.platform == "cpu"]
  if simulated:
    count = max(simulated)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
      os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def _base_spec(args: argparse.Namespace):
  from meshbayes.scaling.aot import StepSpec
  overrides = {name: getattr(args, name) for name, _ in _OVERRIDES
               if getattr(args, name) is not None}
  if args.remat is not None:
    overrides["remat_policy"] = args.remat
  try:
    estimators = tuple(tuple(item.split("=")) for item in args.estimators.split(",") if item)
    if any(len(pair) != 2 for pair in estimators):
      raise ValueError
  except ValueError:
    raise SystemExit(f"--estimators={args.estimators!r} must be component=estimator pairs")
  return StepSpec(model=args.model, deterministic=args.deterministic,
                  overrides=tuple(overrides.items()), estimators=estimators,
                  batch_size=args.batch_size,
                  input_length=args.input_length, target_length=args.target_length,
                  optimizer=args.optimizer, num_microbatches=args.num_microbatches,
                  partitioning=args.partitioning, model_parallel=args.model_parallel)


def _versions() -> dict[str, str]:
  import importlib.metadata
  versions = {}
  for package in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin"):
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  return versions


def _differences(records: list[dict]) -> str:
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


def _from_json(args: argparse.Namespace) -> list[dict]:
  """The predicted step time tables of existing study JSON files (nothing compiled)."""
  from meshbayes.scaling import report
  text, everything = [], []
  for name in args.from_json:
    path = Path(name)
    try:
      records = json.loads(path.read_text())
    except (OSError, ValueError) as error:
      raise SystemExit(f"--from_json: cannot read {name!r} as a scaling-study JSON: {error}")
    if not isinstance(records, list):
      raise SystemExit(f"--from_json: {name!r} holds no list of records")
    everything += records
    text += [f"## {path.name}: predicted step time (roofline)", "",
             report.roofline_table(records)]
  output = "\n".join(text)
  if args.markdown:
    Path(args.markdown).write_text(output)
    print(f"wrote {args.markdown}")
  else:
    print(output)
  return everything


def _weak_batch(args: argparse.Namespace, targets, target) -> int:
  """The global batch on ``target``: --batch_size, scaled with the cores under --weak_scaling."""
  if not args.weak_scaling:
    return args.batch_size
  scaled, remainder = divmod(args.batch_size * target.num_devices, targets[0].num_devices)
  if remainder:
    raise SystemExit(f"--weak_scaling: --batch_size={args.batch_size} x {target.num_devices} / "
                     f"{targets[0].num_devices} cores is not a whole batch on {target.label}")
  return scaled


def main(argv: Sequence[str] | None = None) -> list[dict]:
  args = parse_args(argv)
  if args.from_json is not None:
    return _from_json(args)
  try:
    targets = parse_targets(args.topologies, args.target)
  except ValueError as error:
    raise SystemExit(f"--topologies: {error}")
  _set_up_jax(targets)
  import jax

  from meshbayes.scaling import aot, report, search

  base = _base_spec(args)
  json_path = Path(args.json)
  markdown_path = Path(args.markdown) if args.markdown else json_path.with_suffix(".md")
  plot_path = Path(args.plot) if args.plot else json_path.with_suffix(".png")
  json_path.parent.mkdir(parents=True, exist_ok=True)
  command = "python -m meshbayes.tools.scaling_study " + " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
  context = {"command": command, **{f"{k}_version": v for k, v in _versions().items()}}
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
    if args.search_layers:
      family = search.Family(base, step=args.search_step)
      for layers in (int(n) for n in args.search_layers.split(",")):
        print(f"{target.label}: searching the widest model with {layers}+{layers} layers",
              flush=True)
        bracket = tuple(int(u) for u in args.search_bracket.split(",")) \
            if args.search_bracket else None
        best, _ = search.largest_fit(family, target, layers, compile_and_log,
                                     start_units=args.search_start, bracket=bracket,
                                     max_compiles=args.search_max_compiles)
        summaries.append((target.label, layers, best))
      continue
    sized = base.replace(batch_size=_weak_batch(args, targets, target))
    specs = [sized.replace(deterministic=False), sized.replace(deterministic=True)] \
        if args.compare_deterministic else [sized]
    for spec in specs:
      start = time.perf_counter()
      record = compile_and_log(spec, target)
      needed = report.bytes_needed(record)
      error = f" {record['error']}" if record["error"] else ""
      print(f"{target.label} {record['estimators']}: fits={record['fits']} "
            f"peak={'-' if needed is None else f'{needed / 2**30:.2f} GiB'} "
            f"flops={record.get('flops_per_device') or 0:.3e} "
            f"({time.perf_counter() - start:.0f} s){error}", flush=True)

  text = [f"# {args.title or 'Scaling study'}", "", f"`{command}`", "",
          report.markdown_table(records)]
  if args.compare_deterministic:
    text += ["## Bayesian minus deterministic", "", _differences(records)]
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
  plotted = (report.plot_search if args.search_layers else report.plot)(
      records, plot_path, args.title)
  print(f"wrote {json_path}, {markdown_path}" + (f", {plotted}" if plotted else ""))
  return records


if __name__ == "__main__":
  main()
