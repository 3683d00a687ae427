"""The training loop (T5X style): sharded state, jitted steps, metrics, evaluation and
checkpoints that resume exactly.

Running ``train`` again with the same ``model_dir`` resumes from the latest
checkpoint: the state, the input position and the per-step rng
``fold_in(seed, step)`` are all restored, so the parameters after N steps are
bit-identical however many times the run was interrupted. The input position
is the input iterators' saved state (restored in the same time at any step);
checkpoints that hold none (older ones) resume by reading and dropping the
batches consumed. With ``EvaluationConfig.patience`` a run stops early on its validation
NLL (``meshbayes.training.early_stopping``), and a resumed run where the uninterrupted one would.

What keeps a model directory trustworthy:

- One writer: a run holds ``MODEL_DIR/RUN_LOCK`` (``meshbayes.runtime.run_lock``, by
  process 0) for its life; a second run stops with one line naming the holder.
- Only finite states are saved: the train step reports whether its new
  parameters and optimizer state are all finite (one reduction on device);
  the first that is not stops the run, naming the last finite checkpoint.
- A resume must match what the checkpoints were trained with: the same
  vocabulary (its fingerprint is in every checkpoint's meta) and the same
  batch size (the input position is counted in batches).
- ``config.gin`` describes the checkpoints: each start writes its
  configuration to ``configs/start-<step>-<time>.gin`` once the state is
  restored or initialized and the step compiled, and to ``config.gin`` (what
  ``meshbayes.eval``/``infer`` read) when it saves its first checkpoint; a
  start that fails before then leaves both as they were.
- SIGTERM and SIGINT (``meshbayes.runtime.preemption``) save the last
  completed step and exit 143 or 130; before the first new step, at once.

``model_dir`` may be local or a URI such as ``gs://bucket/run`` (``etils.epath``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import time
from typing import Any, NoReturn

import gin
import jax
import numpy as np
from etils import epath
from flax import traverse_util
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from meshbayes.training import checkpoints as checkpoints_lib
from meshbayes.training import compute_log, early_stopping
from meshbayes.runtime.atomic_files import write_text_atomically
from meshbayes.runtime.console import say as _say  # private: not part of the trainer's interface
from meshbayes.data.pipeline import TaskData, vocabulary_fingerprint
from meshbayes.evaluation.teacher_forced import teacher_forced_metrics
from meshbayes.field_checks import positive_int
from meshbayes.training.host_input import HostBatches, HostInput
from meshbayes.layers import moped_params
from meshbayes.runtime.metrics_writer import MetricsWriter, ProgressBar
from meshbayes.training.optimizers import IVON_META, KLWeight, Optimizer
from meshbayes.training.posterior_diagnostics import median_stddevs
from meshbayes.runtime.preemption import STOP_EXIT_CODES, STOP_SIGNALS
from meshbayes.training.run_configs import CheckpointConfig, EvaluationConfig, InputConfig
from meshbayes.runtime.run_lock import RunLock
from meshbayes.training.train_step import (
  StepFunctions,
  TrainState,
  abstract_state,
  all_finite,
  init_train_state,
  jit_train_step,
)
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner, logical_specs
from meshbayes.partitioning.specs import path_names

_PADDED_VOCAB_MULTIPLE = 128  # a model's vocab_size may pad the vocabulary's up to this


class Preempted(SystemExit):
  """SIGTERM or SIGINT arrived; the last completed step was saved."""


def _param_axes(abstract: TrainState) -> dict[str, list[str | None]]:
  specs = logical_specs({"params": abstract.params})["params"]
  leaves = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(
      x, jax.sharding.PartitionSpec))[0]
  return {"/".join(path_names(p)): list(spec) for p, spec in leaves}


def _deterministic_twin(abstract_params: Any) -> Any:
  """The deterministic model's parameter shapes: ``w`` for each ``w_loc``, no scales."""
  flat = {k: v for k, v in traverse_util.flatten_dict(abstract_params).items()
          if not k[-1].endswith("_scale") and "_prior_" not in k[-1]}
  return traverse_util.unflatten_dict({
      k[:-1] + (k[-1][:-len("_loc")],) if k[-1].endswith("_loc") else k: v
      for k, v in flat.items()})


def _make_model_dir(path: str | os.PathLike) -> epath.Path:
  """``path`` as a directory, created if needed; a file in the way is a one-line error."""
  model_dir = epath.Path(path)
  try:
    model_dir.mkdir(parents=True, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    blocker = next((p for p in (model_dir, *model_dir.parents) if p.is_file()), model_dir)
    raise ValueError(f"train: MODEL_DIR {model_dir} must be a directory, but {blocker} is a "
                     "file") from None
  return model_dir


def _check_vocabulary(model: BaseModel, data: TaskData) -> str:
  """The vocabulary's fingerprint, once its size is checked against the model's.

  Raises:
    ValueError: the model's ``vocab_size`` is not the vocabulary's size, nor
      that size padded up to a multiple of 128 (as T5's 32,128 for 32,100).
  """
  vocabulary = data.vocabulary
  size = vocabulary.vocab_size
  model_size = getattr(getattr(model, "config", None), "vocab_size", None)
  padded = -(-size // _PADDED_VOCAB_MULTIPLE) * _PADDED_VOCAB_MULTIPLE
  if model_size is not None and not size <= model_size <= padded:
    raise ValueError(f"train: the vocabulary of task {data.task!r} has {size:,} pieces but the "
                     f"model is built for vocab_size={model_size:,}; set models.TransformerConfig."
                     f"vocab_size={size} (or up to {padded}, padded to a multiple of "
                     f"{_PADDED_VOCAB_MULTIPLE}), or use the task's vocabulary")
  return vocabulary_fingerprint(vocabulary)


def _check_resume(saved_meta: dict[str, Any], step_dir: epath.Path, data: TaskData,
                  vocabulary: str) -> None:
  """Raises a one-line ValueError when the run does not continue the checkpoint's
  (checkpoints older than these fields pass)."""
  saved_vocabulary = saved_meta.get("vocabulary", vocabulary)
  if saved_vocabulary != vocabulary:
    raise ValueError(f"train: the vocabulary of task {data.task!r} ({vocabulary}) is not the one "
                     f"the checkpoint {step_dir} was trained with ({saved_vocabulary}); resume "
                     "with that vocabulary, or start a new MODEL_DIR")
  saved_batch_size = int(saved_meta.get("batch_size", data.batch_size))
  if saved_batch_size != data.batch_size:
    raise ValueError(f"train: BATCH_SIZE={data.batch_size} differs from the batch size "
                     f"{saved_batch_size} the checkpoint {step_dir} was trained with (its input "
                     f"position is counted in batches); resume with BATCH_SIZE="
                     f"{saved_batch_size}, or start a new MODEL_DIR")


def _lock_model_dir(model_dir: epath.Path) -> RunLock | None:
  """The model directory's lock, taken by process 0 (None on the others).

  Raises:
    OSError: another run holds it (on every process, the others told by process 0).
  """
  lock, error = None, None
  if jax.process_index() == 0:
    lock = RunLock(model_dir)
    try:
      note = lock.acquire()
      if note:
        _say(note)
    except OSError as raised:
      error = raised
  if jax.process_count() > 1:
    failed = bool(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
    if failed and error is None:
      raise OSError(f"process 0 could not lock MODEL_DIR {model_dir}; see its error")
  if error is not None:
    raise error
  return lock


def _check_config(name: str, value: Any, kind: type) -> None:
  if not isinstance(value, kind):
    raise ValueError(f"train: {name}={value!r} must be a {kind.__name__} (bind "
                     f"train.{name} = @run_configs.{kind.__name__}())")


def train(*, model_dir: str, model: BaseModel, data: TaskData, train_steps: int,
          partitioner: Partitioner | None = None, optimizer: Optimizer = Optimizer(),
          kl_weight: KLWeight = KLWeight(), seed: int = 0, log_period: int = 10,
          checkpoint: CheckpointConfig = CheckpointConfig(),
          evaluation: EvaluationConfig = EvaluationConfig(),
          input: InputConfig = InputConfig()) -> TrainState:
  """Trains ``model`` on ``data`` for ``train_steps`` steps, resuming from ``model_dir``.

  Args:
    model_dir: where checkpoints (``checkpoints/``), TensorBoard events
      (``train/``, ``eval/``) and ``metrics.jsonl`` go.
    model: the model (``models.BaseModel``).
    data: the task and batching.
    train_steps: total number of steps (a resumed run continues to it).
    partitioner: the mesh and rules (default: data parallel over all devices).
    optimizer: optimizer and learning-rate schedule.
    kl_weight: KL weight schedule (annealing).
    seed: seed of initialization, dropout and weight noise.
    log_period: steps between metric writes and progress lines.
    checkpoint: when checkpoints are saved and kept, and where a new run's
      parameters come from (``run_configs.CheckpointConfig``).
    evaluation: the validation passes during training
      (``run_configs.EvaluationConfig``).
    input: how the training split is read and each batch split
      (``run_configs.InputConfig``).

  Returns:
    The final train state.
  """
  for name, value in (("train_steps", train_steps), ("log_period", log_period)):
    positive_int("train", name, value)
  for name, value, kind in (("checkpoint", checkpoint, CheckpointConfig),
                            ("evaluation", evaluation, EvaluationConfig),
                            ("input", input, InputConfig)):
    _check_config(name, value, kind)
  steps = StepFunctions.build(model, optimizer, kl_weight, seed, input.num_microbatches)
  model_dir = _make_model_dir(model_dir)
  vocabulary = _check_vocabulary(model, data)
  partitioner = partitioner or Partitioner()
  abstract = abstract_state(model, steps, data.input_shapes())
  shardings = partitioner.shardings(abstract)
  with contextlib.ExitStack() as cleanup:
    STOP_SIGNALS.exit_at_once = True  # nothing to save until a step completes
    if STOP_SIGNALS.install():  # called in-process, not by meshbayes.train
      cleanup.callback(STOP_SIGNALS.uninstall)
    lock = _lock_model_dir(model_dir)
    if lock is not None:
      cleanup.callback(lock.release)
      STOP_SIGNALS.at_quick_exit(lock.release)
    ckpts = checkpoints_lib.Checkpoints(model_dir / "checkpoints", checkpoint.keep,
                                        checkpoint.async_save)
    cleanup.callback(ckpts.close)
    cleanup.callback(ckpts.wait)  # runs first: every started save lands, even on errors
    return _run(_Run(
        model_dir=model_dir, model=model, data=data, vocabulary=vocabulary,
        train_steps=train_steps, seed=seed, log_period=log_period, checkpoint=checkpoint,
        evaluation=evaluation, input=input, partitioner=partitioner, steps=steps,
        abstract=abstract, shardings=shardings, ckpts=ckpts, cleanup=cleanup))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Run:
  """What ``train`` prepared for ``_run``: its settings and the objects built from them."""
  model_dir: epath.Path
  model: BaseModel
  data: TaskData
  vocabulary: str
  train_steps: int
  seed: int
  log_period: int
  checkpoint: CheckpointConfig
  evaluation: EvaluationConfig
  input: InputConfig
  partitioner: Partitioner
  steps: StepFunctions
  abstract: TrainState
  shardings: Any
  ckpts: checkpoints_lib.Checkpoints
  cleanup: contextlib.ExitStack


def _run(run: _Run) -> TrainState:
  """Restores or initializes the state, then trains to ``run.train_steps``."""
  model_dir, model, data, vocabulary = run.model_dir, run.model, run.data, run.vocabulary
  train_steps, partitioner, steps, ckpts = run.train_steps, run.partitioner, run.steps, run.ckpts
  abstract, shardings, log_period = run.abstract, run.shardings, run.log_period
  fallback, input_shards = run.checkpoint.fallback_on_corrupt, run.input.shards
  layout = partitioner.data_layout(data.batch_size)
  latest = ckpts.latest_step()
  if latest is not None:
    _say(f"resuming from the checkpoint of step {latest} in {ckpts.directory}")
    if not fallback:  # fail before reading the arrays
      _check_resume(checkpoints_lib.read_meta(ckpts.step_dir(latest)), ckpts.step_dir(latest),
                    data, vocabulary)
    latest, state, saved_meta = ckpts.restore_latest(partitioner.placed(abstract), fallback)
    if fallback:  # the step restored may be an older one
      _check_resume(saved_meta, ckpts.step_dir(latest), data, vocabulary)
    data_position = int(saved_meta["data_position"])
    if input_shards is None:  # keep the resumed run's input order, whatever the hosts
      input_shards = int(saved_meta.get("input_shards", 1))
  else:
    num_params = sum(x.size for x in jax.tree.leaves(abstract.params))
    _say(f"initializing the train state ({num_params:,} parameters) on a "
         f"{' x '.join(f'{k}={v}' for k, v in partitioner.mesh.shape.items())} mesh")
    state, _ = partitioner.init(
        lambda k: init_train_state(model, steps.optimizer, data.input_shapes(), k),
        jax.random.key(run.seed))
    data_position = 0
    if run.checkpoint.initial_checkpoint:
      state = _initial_parameters(state, abstract, run.checkpoint, partitioner)
  if input_shards is None:
    input_shards = layout.num_shards
  host_input = HostInput(data, layout, input_shards)
  # One host per group of hosts reading the same shards saves their position.
  saves_input = partitioner.shard_readers()[layout.shard_id][0] == jax.process_index()
  meta = {"param_logical_axes": _param_axes(abstract), "input_shards": host_input.input_shards,
          "batch_size": data.batch_size, "vocabulary": vocabulary, "task": data.task}
  if getattr(model, "num_train_units", None) is not None:  # the KL's D, for evaluation
    meta["num_train_units"] = float(model.num_train_units)
  if steps.ivon is not None:  # what turns the saved state into the posterior
    meta[IVON_META] = {"ess": steps.ivon.ess, "weight_decay": steps.ivon.weight_decay}
  start = int(state.step)
  patience, min_delta = run.evaluation.patience, run.evaluation.min_delta
  history = early_stopping.validation_history(model_dir, start) if patience else []
  stopped = patience and early_stopping.stop_point(history, patience, min_delta)
  if stopped:
    _say(f"{model_dir} stopped early at step {stopped.step} (best step {stopped.best_step}); "
         "nothing to do")
    return state
  if start >= train_steps:
    _say(f"{model_dir} already holds step {start} >= train_steps={train_steps}; nothing to do")
    return state
  if jax.process_index() == 0:  # an earlier stop that other settings now continue
    (model_dir / early_stopping.STOP_FILE).unlink(missing_ok=True)
  # This attempt's cost beside the earlier ones' (process 0's own process).
  compute = compute_log.ComputeLog(model_dir, start) if jax.process_index() == 0 else None

  writer = MetricsWriter(model_dir / "train", model_dir / "metrics.jsonl")
  eval_writer = MetricsWriter(model_dir / "eval", model_dir / "eval" / "metrics.jsonl")
  run.cleanup.callback(writer.close)
  run.cleanup.callback(eval_writer.close)
  progress = ProgressBar(train_steps, start)
  eval_fn = jax.jit(steps.eval_step, in_shardings=(
      shardings.params, NamedSharding(partitioner.mesh, partitioner.batch_spec)))
  stddev_medians = jax.jit(lambda p, o: median_stddevs(steps.posterior_stddevs(p, o)))

  def evaluate(state: TrainState) -> dict[str, float]:
    metrics = teacher_forced_metrics(eval_fn, state.params, data.eval_batches(layout),
                                     partitioner)
    medians = jax.device_get(stddev_medians(state.params, state.opt_state))
    return metrics | {k: float(v) for k, v in medians.items()}

  batches = _open_input(host_input, ckpts, latest, data_position)
  _say(f"compiling the train step (step {start + 1})...")
  started = time.perf_counter()
  host_batch = next(batches)
  with partitioner.activation_rules():
    step_fn = jit_train_step(steps, partitioner, shardings).lower(
        state, partitioner.global_batch(host_batch)).compile()
  configuration = gin.config_str()
  if configuration and jax.process_index() == 0:  # the start's, once it is known to work
    (model_dir / "configs").mkdir(exist_ok=True)
    write_text_atomically(
        model_dir / "configs" / f"start-{start}-{time.strftime('%Y%m%d-%H%M%S')}.gin",
        configuration)
  STOP_SIGNALS.exit_at_once = False  # from the first new step on, a signal saves it

  # Metrics stay on the device until a step that logs, evaluates, saves or stops: the host
  # dispatches the next steps meanwhile (T5X-style). Every step's loss is checked finite
  # there, and a state before it is saved (a non-finite state makes the next loss so).
  state_is_finite = jax.jit(lambda state: all_finite((state.params, state.opt_state)))
  pending: list[tuple[int, dict[str, jax.Array]]] = []
  window: list[dict[str, float]] = []
  window_start, window_tokens = time.perf_counter(), 0.0
  last_saved, step = latest, start
  while step < train_steps:
    if step > start:  # the first step's batch was read to compile the step
      host_batch = next(batches)
    with partitioner.activation_rules():
      state, metrics = step_fn(state, partitioner.global_batch(host_batch))
    data_position += 1
    step += 1
    pending.append((step, metrics))
    if step > start + 1:
      window_tokens += float(np.sum(host_batch["decoder_loss_weights"])) * jax.process_count()
    logs = step % log_period == 0 or step == train_steps
    evaluates = bool(run.evaluation.period) and step % run.evaluation.period == 0
    saves = step % run.checkpoint.period == 0 or step == train_steps
    stop = STOP_SIGNALS.received
    if not (logs or evaluates or saves or stop or step == start + 1):
      continue
    for done, values in read_metrics(pending):
      if not math.isfinite(values["loss"]):
        _stop_non_finite(done, values["loss"], bool(state_is_finite(state)), ckpts, last_saved)
      if done > start + 1:  # the first step includes compilation: not throughput
        window.append(values)
    pending = []
    if step == start + 1:
      window_start = time.perf_counter()
      progress.start_clock(step)
      _say(f"step {step} took {window_start - started:.1f} s (compilation included); "
           "training")
    if window and logs:
      seconds = time.perf_counter() - window_start
      logged = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
      logged.update(tokens_per_second=window_tokens / seconds,
                    step_seconds=seconds / len(window))
      writer.write(step, logged)
      progress.update(step, logged)
      window, window_tokens, window_start = [], 0.0, time.perf_counter()
    paused = time.perf_counter()  # evaluation and saving are not step time
    if evaluates:
      validation = evaluate(state)
      eval_writer.write(step, validation)
      if patience:
        history.append((step, validation["nll"]))
        stopped = early_stopping.stop_point(history, patience, min_delta)
        saves = saves or bool(stopped)
    if (saves or stop) and not state_is_finite(state):
      _stop_non_finite(step, values["loss"], False, ckpts, last_saved)
    if saves or stop:
      ckpts.save(step, state, dict(meta, data_position=data_position),
                 batches.states() if saves_input else None)
      if last_saved in (None, start):  # this start's first checkpoint
        if configuration and jax.process_index() == 0:
          write_text_atomically(model_dir / "config.gin", configuration)
      last_saved = step
      if compute is not None:
        compute.saved(step)
    window_start += time.perf_counter() - paused
    if stopped:
      ckpts.wait()
      if jax.process_index() == 0:
        write_text_atomically(model_dir / early_stopping.STOP_FILE, json.dumps(
            dict(dataclasses.asdict(stopped), patience=patience, min_delta=min_delta)))
      _say(f"stopped early at step {step}: {patience} validation passes without a better "
           f"NLL than step {stopped.best_step}'s {stopped.best_nll:.4f}; checkpoints in "
           f"{ckpts.directory}")
      return state
    if stop:
      ckpts.wait()
      _say(f"{signal.Signals(stop).name}: saved the checkpoint of step {step}; run again to "
           "resume")
      raise Preempted(STOP_EXIT_CODES[stop])
  ckpts.wait()  # the final save has landed (or this raises) before the run says it is done
  _say(f"trained to step {step}: checkpoints in {ckpts.directory}, metrics in "
       f"{model_dir / 'metrics.jsonl'} (TensorBoard: tensorboard --logdir {model_dir})")
  return state


def read_metrics(pending: list[tuple[int, dict[str, jax.Array]]]
                 ) -> list[tuple[int, dict[str, float]]]:
  """The steps' metrics read back from the device at once: the loop's only wait on it."""
  values = jax.device_get([metrics for _, metrics in pending])
  return [(step, {k: float(v) for k, v in m.items()}) for (step, _), m in zip(pending, values)]


def _stop_non_finite(step: int, loss: float, state_is_finite: bool,
                     ckpts: checkpoints_lib.Checkpoints, last_saved: int | None) -> NoReturn:
  """Raises the one-line error of a non-finite step, once the saves started have landed
  (every saved state was checked finite)."""
  ckpts.wait()
  what = f"loss {loss}" if state_is_finite else f"parameters or optimizer state (loss {loss})"
  last = (f"the last finite checkpoint is step {last_saved} in {ckpts.directory}"
          if last_saved is not None else f"no checkpoint was saved in {ckpts.directory}")
  raise FloatingPointError(f"non-finite {what} after step {step}; training stopped without "
                           f"saving it; {last}")


def _open_input(host_input: HostInput, ckpts: checkpoints_lib.Checkpoints,
                latest: int | None, data_position: int) -> HostBatches:
  """This host's batches from where the checkpoint of step ``latest`` left them."""
  shards = len(host_input.shard_ids)
  states = ({} if latest is None else
            checkpoints_lib.read_input_states(ckpts.step_dir(latest), host_input.state_names))
  if data_position:
    how = ("restoring its saved position" if len(states) == shards else
           f"reading and dropping the {data_position:,} batches consumed (the checkpoint "
           "holds no input position for them)")
    _say(f"opening the training input ({shards} shard(s) on this host), {how}...")
  opened = time.perf_counter()
  batches = host_input.train_batches(start_batch=data_position, states=states)
  if data_position:
    _say(f"input at batch {data_position:,} after {time.perf_counter() - opened:.1f} s")
  return batches


def _initial_parameters(state: TrainState, abstract: TrainState, config: CheckpointConfig,
                        partitioner: Partitioner) -> TrainState:
  """The state with parameters from ``config.initial_checkpoint`` (MOPED when it is the
  deterministic twin's)."""
  step_dir = checkpoints_lib.find_step_dir(config.initial_checkpoint)
  from_deterministic, delta = config.initial_from_deterministic, config.moped_delta
  target = partitioner.placed({"params": abstract.params})
  if not from_deterministic:
    params = checkpoints_lib.restore_subtree(step_dir, target)["params"]
    _say(f"initial parameters from {step_dir}")
    return state.replace(params=params)
  twin = checkpoints_lib.restore_subtree(step_dir,
                                         {"params": _deterministic_twin(target["params"])})
  param_shardings = jax.tree.map(lambda x: x.sharding, target["params"])
  with partitioner.activation_rules():
    params = jax.jit(lambda p, d: moped_params(p, d, delta), out_shardings=param_shardings)(
        state.params, twin["params"])
  _say(f"initial posterior from the deterministic checkpoint {step_dir} "
        f"(MOPED, delta={delta})")
  return state.replace(params=params)
