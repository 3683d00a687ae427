"""Compiles one train step for an NVIDIA GPU without one, with whichever meshbayes is importable.

Run as a file, not a module, so that an older checkout on ``PYTHONPATH`` is the
code compiled (``tools/gpu_model_check.py`` compiles the code that was measured
on the H200 this way). It uses only what every version since the scaling
studies has: ``scaling.aot.StepSpec``, ``prepare_step`` and ``targets.Target``.
Needs JAX's CUDA plugin (the ``gpu-aot`` extra).

  python tools/deviceless_compile.py '{"spec": {...}, "target_config": "...",
      "compiler_options": {...}, "hlo": "out.hlo.txt.gz"}'

Writes the optimized HLO (gzipped, op metadata dropped) and prints one JSON
line: XLA's memory analysis and the compile seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time

# ", metadata={...}" of every instruction and the module's tables of stack frames:
# source locations, not program.
_METADATA = re.compile(r', metadata=\{[^{}]*\}')
_FRAME_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def strip_metadata(hlo_text: str) -> str:
  """An HLO module's text without source locations."""
  blocks = _METADATA.sub("", hlo_text).split("\n\n")
  return "\n\n".join(b for b in blocks if b.split("\n", 1)[0] not in _FRAME_TABLES)


def parse_args(argv: list[str]) -> dict:
  """The request: one JSON object (``spec``, ``target_config``, ``compiler_options``, ``hlo``)."""
  parser = argparse.ArgumentParser(prog="deviceless_compile.py",
                                   description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="\n".join(__doc__.splitlines()[2:]))
  parser.add_argument("request", help="the JSON request: spec (scaling.aot.StepSpec's fields), "
                      "target_config, compiler_options, hlo (the output's path)")
  text = parser.parse_args(argv).request
  try:
    request = json.loads(text)
  except ValueError as error:
    parser.error(f"request={text[:80]!r} is not JSON: {error}")
  missing = [key for key in ("spec", "target_config", "hlo")
             if not isinstance(request, dict) or key not in request]
  if missing:
    parser.error(f"request={text[:80]!r} lacks {', '.join(missing)}: give a JSON object "
                 "with spec, target_config and hlo")
  return request


def main(argv: list[str]) -> dict:
  request = parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from jax.experimental import topologies

  from meshbayes.scaling import aot, targets

  devices = list(topologies.get_topology_desc(
      platform="cuda", target_config=request["target_config"], topology="1x1x1").devices)

  class Deviceless(targets.Target):
    def devices(self):
      return devices

  spec_fields = dict(request["spec"])
  spec_fields["overrides"] = tuple(tuple(pair) for pair in spec_fields.get("overrides", ()))
  spec = aot.StepSpec(**spec_fields)
  start = time.perf_counter()
  compiled = aot.prepare_step(spec, Deviceless("deviceless", "cpu", 1, None, None)).lower(
  ).compile(compiler_options=request.get("compiler_options") or {})
  memory = compiled.memory_analysis()
  text = strip_metadata(compiled.as_text())
  with open(request["hlo"], "wb") as out:
    out.write(gzip.compress(text.encode(), mtime=0))
  report = {"compile_seconds": time.perf_counter() - start,
            "argument_bytes": int(memory.argument_size_in_bytes),
            "temp_bytes": int(memory.temp_size_in_bytes),
            "output_bytes": int(memory.output_size_in_bytes),
            "alias_bytes": int(memory.alias_size_in_bytes)}
  # Not strict_json: the code this runs under may predate it (the figures are finite).
  print(json.dumps(report, allow_nan=False), flush=True)
  return report


if __name__ == "__main__":
  main(sys.argv[1:])
