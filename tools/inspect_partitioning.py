"""Print where every array of a model's train state lives on a mesh, and its bytes per device.

What to look at before launching a pod job: each parameter and optimizer-state
array with its logical axes, mesh axes, total and per-device bytes, and the
per-device totals (``meshbayes.scaling.state_placements``).

  python -m meshbayes.tools.inspect_partitioning --model=mlp --mesh=2x4 --rules=megatron
  python -m meshbayes.tools.inspect_partitioning --model=base --mesh=2x4 --rules=fsdp_tp --optimizer=adafactor

``--model`` is ``mlp`` or a Transformer preset (tiny, small, base, large, paper,
10b). Only shapes are computed, so any preset is inspected in seconds. On a CPU
machine the mesh's devices are simulated.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshbayes import partitioning
from meshbayes.models.configurables import PRESETS
from meshbayes.scaling.state_placements import OPTIMIZERS, placement_table

PROG = "meshbayes.tools.inspect_partitioning"


def parse_mesh(text: str) -> tuple[int, int]:
  """``'2x4'`` -> ``(2, 4)``: data x model sizes, -1 allowed for one of them."""
  try:
    data, model = (int(part) for part in text.lower().split("x"))
  except ValueError:
    raise argparse.ArgumentTypeError(f"--mesh={text!r} must be DATAxMODEL, e.g. 2x4 or -1x2")
  return data, model


def main(argv: Sequence[str] | None = None) -> str:
  """Prints the table (and returns it); a bad mesh, model or rule exits with one line."""
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=("mlp",) + PRESETS, default="mlp")
  parser.add_argument("--mesh", type=parse_mesh, default=(2, 4), help="DATAxMODEL, e.g. 2x4")
  parser.add_argument("--rules", default="megatron", choices=sorted(partitioning.PRESETS))
  parser.add_argument("--optimizer", default="adamw", choices=sorted(OPTIMIZERS))
  parser.add_argument("--deterministic", action="store_true", help="the deterministic twin")
  parser.add_argument("--hidden", type=int, default=1024)
  parser.add_argument("--input_dim", type=int, default=512)
  parser.add_argument("--classes", type=int, default=1024)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=16, help="sequence length (Transformers)")
  args = parser.parse_args(argv)
  try:
    table = placement_table(args.model, args.mesh, args.rules, args.optimizer,
                            deterministic=args.deterministic, hidden=args.hidden,
                            input_dim=args.input_dim, classes=args.classes, batch=args.batch,
                            length=args.length)
  except ValueError as error:  # an indivisible dimension, a mesh the devices cannot hold, ...
    raise SystemExit(f"{PROG}: error: {error}") from None
  print(f"model {args.model} ({'deterministic' if args.deterministic else 'Bayesian'}), "
        f"rules {args.rules}, optimizer {args.optimizer}")
  print(table)
  return table


if __name__ == "__main__":
  main()
