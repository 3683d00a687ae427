"""Print the parameter counts of every model preset, deterministic and Bayesian.

Counts come from shapes alone (``meshbayes.scaling.model_sizes``), so the 10B
preset costs nothing to count.

  python -m meshbayes.tools.model_sizes [--presets=tiny,paper]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshbayes.models.configurables import PRESETS
from meshbayes.scaling.model_sizes import preset_sizes


def main(argv: Sequence[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--presets", default=",".join(PRESETS))
  args = parser.parse_args(argv)
  rows = []
  print(f"{'preset':>7} {'d_model':>7} {'heads x kv':>10} {'layers':>6} {'d_ff':>7} "
        f"{'deterministic':>15} {'Bayesian weights':>17} {'variational':>15}")
  for name in args.presets.split(","):
    sizes = preset_sizes(name)
    config = sizes.pop("config")
    rows.append(dict(preset=name, **sizes))
    print(f"{name:>7} {config.emb_dim:>7} {f'{config.num_heads}x{config.head_dim}':>10} "
          f"{f'{config.num_encoder_layers}+{config.num_decoder_layers}':>6} {config.mlp_dim:>7} "
          f"{sizes['deterministic']:>15,} {sizes['bayesian_weights']:>17,} "
          f"{sizes['variational']:>15,}")
  return rows


if __name__ == "__main__":
  main()
