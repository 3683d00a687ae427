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
JSON; the records' fields: ``meshbayes.scaling.study``). ``--from_json``
recomputes the predicted step time table from existing JSON files without compiling.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Only what parses names and writes JSON: the environment must be set before JAX starts.
from meshbayes.scaling import study
from meshbayes.scaling.study import records_text  # noqa: F401  (tests/test_strict_json.py)
from meshbayes.scaling.targets import parse_targets


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
  for name, kind in study.OVERRIDES:
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


def _width_search(args: argparse.Namespace) -> study.WidthSearch | None:
  """The ``--search_*`` flags' search, or None without ``--search_layers``."""
  layers = tuple(int(n) for n in args.search_layers.split(",") if n)
  if not layers:
    return None
  bracket = tuple(int(u) for u in args.search_bracket.split(",")) if args.search_bracket \
      else None
  return study.WidthSearch(layers, args.search_step, args.search_start, bracket,
                           args.search_max_compiles)


def main(argv: Sequence[str] | None = None) -> list[dict]:
  args = parse_args(argv)
  try:
    if args.from_json is not None:
      output, records = study.from_json_tables(args.from_json)
      if args.markdown:
        Path(args.markdown).write_text(output)
        print(f"wrote {args.markdown}")
      else:
        print(output)
      return records
    try:
      targets = parse_targets(args.topologies, args.target)
    except ValueError as error:
      raise ValueError(f"--topologies: {error}") from None
    study.set_up_jax(targets)
    base = study.base_spec(vars(args))
    json_path = Path(args.json)
    command = "python -m meshbayes.tools.scaling_study " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    return study.run_study(
        base, targets, json_path,
        Path(args.markdown) if args.markdown else json_path.with_suffix(".md"),
        Path(args.plot) if args.plot else json_path.with_suffix(".png"), command,
        title=args.title, compare_deterministic=args.compare_deterministic,
        weak_scaling=args.weak_scaling, width_search=_width_search(args))
  except ValueError as error:  # a bad option's one line
    raise SystemExit(str(error)) from None


if __name__ == "__main__":
  main()
