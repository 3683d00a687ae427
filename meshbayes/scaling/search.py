"""The largest model of a family that fits a target: a search over width by compiling.

A ``Family`` keeps a preset's proportions as its width ``d`` (a multiple of ``step``)
grows; ``largest_fit`` finds, for one depth, a width that compiles within the target's
memory next to one, ``step`` wider, that does not. Every probe is a real compile
(docs/scaling.md, study 4: how the widths are chosen).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax

from meshbayes.scaling.aot import StepSpec, build_steps
from meshbayes.scaling.report import bytes_needed
from meshbayes.scaling.targets import Target
from meshbayes.training.train_step import abstract_state

Record = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Family:
  """Models of the base preset's proportions, by width and depth.

  Attributes:
    base: the spec whose preset (and overrides) set the proportions, batch,
      optimizer and partitioning.
    step: width granularity (a multiple of ``head_dim`` keeps heads whole; a
      multiple of the mesh axes keeps every dimension divisible).
  """

  base: StepSpec
  step: int = 256

  def __post_init__(self):
    config = self.base.config()
    heads = config.num_heads * self.step / config.emb_dim
    if self.step < 1 or heads != int(heads) or heads < 1:
      raise ValueError(f"Family: step={self.step} must give a whole number of heads "
                       f"({config.num_heads} heads per {config.emb_dim} of width)")

  def spec(self, units: int, num_layers: int) -> StepSpec:
    """The model ``units * step`` wide with ``num_layers`` layers per stack."""
    config = self.base.config()
    width = units * self.step
    return self.base.with_overrides(
        emb_dim=width, num_heads=config.num_heads * width // config.emb_dim,
        mlp_dim=config.mlp_dim * width // config.emb_dim, num_layers=num_layers)


def state_bytes_per_device(spec: StepSpec, num_devices: int) -> float:
  """Parameters and optimizer state per device, were they split evenly (shapes only)."""
  model, steps = build_steps(spec)
  leaves = jax.tree.leaves(abstract_state(model, steps, spec.input_shapes()))
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves) / num_devices


def _next_units(fit: int, miss: int | None, needed_at_fit: float | None,
                needed_at_miss: float | None, limit: float, growth: float) -> int:
  """The next width to compile, in units, from the bracket ``(fit, miss)``."""
  if miss is None:
    if needed_at_fit and needed_at_fit < 0.5 * limit:  # far below: the compiler is not squeezing
      growth = max(growth, min(2.0, math.sqrt(limit / needed_at_fit)))
    return max(fit + 1, math.ceil(fit * growth))
  if fit:  # bisect: half of the bracket in parameters (~ d^2)
    return min(miss - 1, max(fit + 1, round(math.sqrt(fit * miss))))
  # Nothing fit yet: bytes grow at most like d^2, so the boundary is at least this far
  # down. (Once something fits this hint is too cautious: the compiler's figure for a
  # program that does not fit is before its own rematerialization.)
  guess = miss / growth
  if needed_at_miss:
    guess = min(guess, miss * math.sqrt(limit / needed_at_miss))
  return max(1, min(miss - 1, math.floor(guess)))


def largest_fit(family: Family, target: Target, num_layers: int,
                compile_fn: Callable[[StepSpec, Target], Record], *,
                start_units: int | None = None, bracket: tuple[int, int] | None = None,
                max_compiles: int = 6, margin: float = 0.97, growth: float = 1.25,
                log: Callable[[str], None] = lambda line: print(line, flush=True)
                ) -> tuple[Record | None, list[Record]]:
  """The widest model of ``family`` with ``num_layers`` layers that fits ``target``.

  Args:
    family: the model family.
    target: where it must fit (its ``usable_hbm_bytes`` guides the guesses).
    num_layers: layers per stack.
    compile_fn: compiles a spec for a target and returns its record
      (``aot.compile_step``).
    start_units: first width to try, in ``family.step`` units (default: the
      width whose parameters and optimizer state fill a third of memory).
    bracket: ``(fits, does_not)`` widths in units already known (an earlier
      search's), to go on bisecting between without compiling them again.
    max_compiles: most compiles for this depth.
    margin: aim guesses from out-of-memory compiles at this fraction of memory.
    growth: width factor between probes until one does not fit.
    log: progress lines.

  Returns:
    ``(best, records)``: the widest fitting record (None if none fit) and
    every record compiled, each with ``search_units`` and ``bracketed`` (the
    next width up was compiled and did not fit).
  """
  limit = float(target.usable_hbm_bytes or 0)
  if not limit:
    raise ValueError(f"target {target.label} has no memory size to search against")
  if start_units is None:
    per_unit = state_bytes_per_device(family.spec(4, num_layers), target.num_devices) / 16
    start_units = max(1, int(math.sqrt(limit / 3 / per_unit)))
  records: dict[int, Record] = {}
  fit, miss = bracket if bracket else (0, None)  # widest fitting, narrowest failing width
  if bracket:
    if not 0 < fit < miss:
      raise ValueError(f"bracket={bracket}: need 0 < fitting width < failing width")
    start_units = _next_units(fit, miss, None, None, margin * limit, growth)

  def probe(units: int) -> Record:
    spec = family.spec(units, num_layers)
    log(f"  {target.label} L={num_layers} d={units * family.step}: compiling ...")
    record = compile_fn(spec, target)
    record["search_units"] = units
    records[units] = record
    needed = bytes_needed(record)
    log(f"  {target.label} L={num_layers} d={units * family.step}: "
        f"fits={record.get('fits')} needs={'?' if needed is None else f'{needed / 2**30:.2f} GiB'}"
        f"{' error: ' + record['error'] if record.get('error') else ''}")
    return record

  units = start_units
  for _ in range(max_compiles):
    record = probe(units)
    if record.get("error"):
      break
    if record.get("fits"):
      fit = max(fit, units)
    else:
      miss = units if miss is None else min(miss, units)
    if miss is not None and miss - fit <= 1:
      break
    units = _next_units(fit, miss, bytes_needed(records[fit]) if fit in records else None,
                        bytes_needed(records[miss]) if miss in records else None,
                        margin * limit, growth)
    if units in records:
      break
  best = records.get(fit)
  for units, record in records.items():
    record["bracketed"] = miss is not None and units == fit and miss == fit + 1
  return best, [records[k] for k in sorted(records)]
