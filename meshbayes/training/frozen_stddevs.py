"""Posterior stddevs frozen at another run's: the noise-without-KL control (issue 69).

``run_configs.CheckpointConfig.frozen_stddevs_from`` names a run with Bayesian layers of
the same model shape (the KL-0.1 run of the same seed; gin_configs/uncertainty/noise.gin
and noise_map.gin). A new run then starts as a fresh run of its seed, except that every
posterior scale (``w_scale``, ``stddev = softplus(w_scale)``) is the source's at its best
checkpoint by validation NLL, or at ``frozen_stddevs_step`` (``source``, ``load``). Its
optimizer (``freeze``) never moves them: their gradients are zeroed before it, so they count
in no clipping norm and no moment, and their updates after it are ``-0.0`` (``x + -0.0`` is
``x`` bitwise, ``-0.0`` included). The means and every other parameter train as the
recipe trains them with the scales as constants. Every checkpoint's meta (``META_KEY``) and
``MODEL_DIR/frozen_stddevs.json`` (``RECORD_FILE``) record the source run, its step and a
checksum of the scales taken; a resumed run must name the same source (``check_resume``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import optax
from etils import epath
from flax import traverse_util

from meshbayes.layers.variational import posterior_part
from meshbayes.partitioning.specs import path_names
from meshbayes.training import checkpoint_integrity, early_stopping
from meshbayes.training import checkpoints as checkpoints_lib
from meshbayes.training.train_step import StepFunctions

META_KEY = "frozen_stddevs"
RECORD_FILE = "frozen_stddevs.json"
BINDING = "run_configs.CheckpointConfig.frozen_stddevs_from"
BEST, GIVEN = "best validation NLL", "given"
_EXPECTED = ("expected the run directory of a run with Bayesian layers of this model's shape "
             "(the KL-0.1 run of the same seed)")


def is_posterior_scale(name: str) -> bool:
  """Whether a parameter named ``name`` is a posterior scale (``kernel_scale``): not a
  prior's trainable scalar, not a norm's ``scale``."""
  return (posterior_part(str(name)) or ("", ""))[1] == "scale"


def _scale_leaf(path: tuple[Any, ...]) -> bool:
  names = path_names(path)
  return bool(names) and is_posterior_scale(names[-1])


def frozen(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """``inner`` that leaves every posterior scale as it is.

  The scales' gradients are zeroed before ``inner`` (a clipping norm and the moments see
  only the trained parameters, as if the scales were constants; Adam's moments of the
  scales stay 0) and their updates after it are ``-0.0``. The state is ``inner``'s, so
  its paths are the recipe's.
  """

  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    zeroed = jax.tree_util.tree_map_with_path(
        lambda p, g: jnp.zeros_like(g) if _scale_leaf(p) else g, updates)
    updates, state = inner.update(zeroed, state, params)
    # -0.0, not 0.0: -0.0 + 0.0 is 0.0, so a scale of -0.0 would change its bits.
    return jax.tree_util.tree_map_with_path(
        lambda p, u: jnp.full_like(u, -0.0) if _scale_leaf(p) else u, updates), state

  return optax.GradientTransformation(inner.init, update)


def freeze(steps: StepFunctions) -> StepFunctions:
  """``steps`` whose optimizer leaves the posterior scales as they are (``frozen``).

  Raises:
    ValueError: the model has no Bayesian layers, or the optimizer is IVON's.
  """
  if steps.ivon is not None or not steps.model.is_bayesian:
    raise ValueError(f"train: {BINDING} freezes the posterior stddevs of Bayesian layers, but "
                     "this model has none; use a model with Bayesian layers (uncertainty/"
                     "noise.gin) or unset it")
  return dataclasses.replace(steps, optimizer=frozen(steps.optimizer))


@dataclasses.dataclass(frozen=True)
class Source:
  """The checkpoint the scales come from.

  Attributes:
    run: the source run's directory (absolute).
    step: its checkpoint's step.
    chosen_by: ``BEST`` (the lowest validation NLL) or ``GIVEN`` (``frozen_stddevs_step``).
  """

  run: str
  step: int
  chosen_by: str

  @property
  def step_dir(self) -> epath.Path:
    return checkpoints_lib.as_path(self.run) / "checkpoints" / str(self.step)


def source(run: str | os.PathLike, step: int | None = None) -> Source:
  """The checkpoint of ``run`` the scales come from: ``step``, or the lowest validation NLL
  of its periodic evaluations (the earliest among ties), which must have been kept.

  Raises:
    ValueError: one line naming ``run`` and what was expected.
  """
  path = checkpoints_lib.as_path(run)
  where = f"train: {BINDING}={os.fspath(run)!r}"
  kept = [int(p.name) for p in checkpoints_lib.step_dirs(path / "checkpoints")]
  if not kept:
    raise ValueError(f"{where} holds no checkpoints/ (no such run, or not trained yet); "
                     f"{_EXPECTED}")
  chosen_by = GIVEN
  if step is None:
    curve = [(s, nll) for s, nll in early_stopping.validation_history(path)
             if math.isfinite(nll)]
    if not curve:
      raise ValueError(f"{where} has no validation NLL (eval/metrics.jsonl) to take its best "
                       f"checkpoint from; give the step: run_configs.CheckpointConfig."
                       f"frozen_stddevs_step (kept: {kept})")
    step, chosen_by = min(curve, key=lambda point: (point[1], point[0]))[0], BEST
  if step not in kept:
    what = "its best checkpoint by validation NLL" if chosen_by == BEST else "the checkpoint"
    raise ValueError(f"{where}: {what}, step {step}, is not kept (kept: {kept}); {_EXPECTED}, "
                     "its checkpoints kept (run_configs.CheckpointConfig.keep=None)")
  return Source(os.fspath(path), int(step), chosen_by)


def _scales(tree: Any) -> dict[tuple[str, ...], Any]:
  return {k: v for k, v in traverse_util.flatten_dict(dict(tree)).items()
          if is_posterior_scale(k[-1])}


def _check_shapes(src: Source, target: dict[tuple[str, ...], Any]) -> None:
  """Raises a one-line ValueError unless the source's scales are the target's, shape for
  shape."""
  where = f"train: {BINDING}={src.run!r} (step {src.step})"
  try:
    saved = _scales(checkpoints_lib.saved_tree(src.step_dir).get("params", {}))
  except checkpoints_lib.CheckpointError as error:
    raise ValueError(f"{where} could not be read ({error}); {_EXPECTED}") from error
  if not saved:
    raise ValueError(f"{where} holds no posterior scales (a deterministic or IVON run); "
                     f"{_EXPECTED}")
  name = lambda k: "params/" + "/".join(k)
  problems = [f"{name(k)} has shape {tuple(saved[k].shape)}, this model's is "
              f"{tuple(target[k].shape)}" for k in sorted(saved.keys() & target.keys())
              if tuple(saved[k].shape) != tuple(target[k].shape)]
  problems += [f"{name(k)} is missing" for k in sorted(target.keys() - saved.keys())]
  problems += [f"{name(k)} is not in this model" for k in sorted(saved.keys() - target.keys())]
  if problems:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise ValueError(f"{where} is of another model: {problems[0]}{more}; {_EXPECTED}")


def load(src: Source, params: Any, target: Any) -> tuple[Any, dict[str, Any]]:
  """``params`` with every posterior scale the source's, and the record of where they came from.

  Args:
    src: the checkpoint (``source``).
    params: a new run's initialized parameters (unboxed).
    target: their ``ShapeDtypeStruct``s with shardings (``Partitioner.placed``).

  Returns:
    ``(params, record)``: ``record`` names the run, its step, how the step was chosen and
    a checksum of the scales taken (``checkpoint_integrity``'s, over every scale).

  Raises:
    ValueError: one line, when the source holds other scales than this model's.
  """
  wanted = _scales(target)
  _check_shapes(src, wanted)
  restored = checkpoints_lib.restore_subtree(
      src.step_dir, {"params": traverse_util.unflatten_dict(wanted)})["params"]
  flat = traverse_util.flatten_dict(dict(params))
  flat.update(_scales(restored))
  sums = checkpoint_integrity.checksums(restored)
  digest = hashlib.sha256("".join(f"{k}={v}\n" for k, v in sorted(sums.items())).encode())
  record = {"run": src.run, "step": src.step, "chosen_by": src.chosen_by,
            "scales": len(sums), "scales_checksum": digest.hexdigest()[:16]}
  return traverse_util.unflatten_dict(flat), record


def check_resume(meta: dict[str, Any], step_dir: epath.Path, run: str | None,
                 step: int | None) -> None:
  """Raises a one-line ValueError unless a run resumed from the checkpoint ``step_dir``
  (its JSON metadata ``meta``) names the source its scales were frozen at: the same run
  (``run``, None: none) and, when ``step`` is given, the same step."""
  recorded = meta.get(META_KEY)
  if run is None and recorded is None:
    return
  if recorded is None:
    raise ValueError(f"train: {BINDING}={run!r} but the checkpoint {step_dir} trained its "
                     "posterior stddevs; unset it to resume, or start a new MODEL_DIR")
  was = f"{recorded['run']!r} (step {recorded['step']})"
  if run is None:
    raise ValueError(f"train: the checkpoint {step_dir} has its posterior stddevs frozen at "
                     f"{was}; resume with {BINDING}={recorded['run']!r}, or start a new "
                     "MODEL_DIR")
  if (os.fspath(checkpoints_lib.as_path(run)) != recorded["run"]
      or step not in (None, recorded["step"])):
    given = f"{run!r}" + (f" (step {step})" if step is not None else "")
    raise ValueError(f"train: {BINDING}={given} but the checkpoint {step_dir} has its posterior "
                     f"stddevs frozen at {was}; resume with that source, or start a new "
                     "MODEL_DIR")
