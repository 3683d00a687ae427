"""The training loop (T5X style): sharded state, jitted steps, metrics, validation passes
and checkpoints. ``train`` with an existing ``model_dir`` resumes from its latest
checkpoint bit-identically (state, input position, per-step rng), stops early where an
uninterrupted run would, and saves only finite states; one run holds the directory at a
time (docs/training.md, "The trainer"). ``model_dir`` may be a URI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any, NoReturn

import gin
import jax
import numpy as np
from etils import epath
from flax import traverse_util
from jax.sharding import NamedSharding

from meshbayes.data.pipeline import TaskData, vocabulary_fingerprint
from meshbayes.training.teacher_forced import teacher_forced_metrics
from meshbayes.field_checks import positive_int
from meshbayes.layers import moped_params
from meshbayes.runtime import strict_json
from meshbayes.runtime.atomic_files import write_text_atomically
from meshbayes.runtime.console import say as _say  # private: not part of the trainer's interface
from meshbayes.runtime.metrics_writer import MetricsWriter, ProgressBar
from meshbayes.runtime.preemption import STOP_EXIT_CODES, STOP_SIGNALS
from meshbayes.runtime import run_lock
from meshbayes.training import checkpoints as checkpoints_lib
from meshbayes.training import compute_log, early_stopping, frozen_stddevs, step_loop
from meshbayes.training.host_input import HostBatches, HostInput
from meshbayes.training.optimizers import IVON_META, KLWeight, Optimizer
from meshbayes.training.posterior_diagnostics import median_stddevs
from meshbayes.training.run_configs import CheckpointConfig, EvaluationConfig, InputConfig
from meshbayes.training.step_loop import read_metrics  # public here too (tests replace it)
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
                  vocabulary: str, checkpoint: CheckpointConfig) -> None:
  """Raises a one-line ValueError when the run does not continue the checkpoint's
  (checkpoints older than these fields pass)."""
  frozen_stddevs.check_resume(saved_meta, step_dir, checkpoint.frozen_stddevs_from,
                              checkpoint.frozen_stddevs_step)
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
  if checkpoint.frozen_stddevs_from is not None:  # the noise-without-KL control
    steps = frozen_stddevs.freeze(steps)
  model_dir = _make_model_dir(model_dir)
  vocabulary = _check_vocabulary(model, data)
  partitioner = partitioner or Partitioner()
  abstract = abstract_state(model, steps, data.input_shapes())
  shardings = partitioner.shardings(abstract)
  with contextlib.ExitStack() as cleanup:
    STOP_SIGNALS.exit_at_once = True  # nothing to save until a step completes
    if STOP_SIGNALS.install():  # called in-process, not by meshbayes.train
      cleanup.callback(STOP_SIGNALS.uninstall)
    def acquired():
      held = run_lock.RunLock(model_dir)
      return held, held.acquire()

    lock = run_lock.acquire_on_process_0(
        acquired, _say, f"process 0 could not lock MODEL_DIR {model_dir}; see its error")
    if lock is not None:
      cleanup.callback(lock.release)
      STOP_SIGNALS.at_quick_exit(lock.release)
    ckpts = checkpoints_lib.Checkpoints(model_dir / "checkpoints", checkpoint.keep,
                                        checkpoint.async_save)
    cleanup.callback(ckpts.close)
    cleanup.callback(ckpts.wait)  # runs first: every started save lands, even on errors
    start = _restore_or_initialize(
        ckpts, partitioner, abstract, checkpoint.fallback_on_corrupt,
        check=lambda meta, step_dir: _check_resume(meta, step_dir, data, vocabulary,
                                                   checkpoint),
        initialize=lambda: _initialize(model, steps, data, partitioner, abstract, checkpoint,
                                       seed))
    layout = partitioner.data_layout(data.batch_size)
    host_input = HostInput(data, layout, input.shards or start.input_shards or layout.num_shards)
    meta = _checkpoint_meta(model, data, steps, abstract, vocabulary, host_input,
                            start.frozen_stddevs)
    state, step = start.state, int(start.state.step)
    history = (early_stopping.validation_history(model_dir, step) if evaluation.patience
               else [])
    stopped = evaluation.patience and early_stopping.stop_point(history, evaluation.patience,
                                                                evaluation.min_delta)
    if stopped:
      _say(f"{model_dir} stopped early at step {stopped.step} (best step {stopped.best_step}); "
           "nothing to do")
      return state
    if step >= train_steps:
      _say(f"{model_dir} already holds step {step} >= train_steps={train_steps}; nothing to do")
      return state
    if jax.process_index() == 0:  # an earlier stop that other settings now continue
      (model_dir / early_stopping.STOP_FILE).unlink(missing_ok=True)
    batches = _open_input(host_input, ckpts, start.restored_step, start.data_position)
    compiled = _compile(steps, partitioner, shardings, state, batches, model_dir)
    # One host per group of hosts reading the same shards saves their position.
    saves_input = partitioner.shard_readers()[layout.shard_id][0] == jax.process_index()
    outputs = _Outputs.open(model_dir, ckpts, meta, saves_input, cleanup, step)
    evaluate = _validation(steps, partitioner, shardings, data, layout)
    schedule = _Schedule(train_steps, log_period, checkpoint.period, evaluation)
    return _train_loop(state, start, compiled, schedule, outputs, evaluate, history)


@dataclasses.dataclass(frozen=True)
class _Start:
  """Where this start of a run begins.

  Attributes:
    state: the train state restored or initialized.
    restored_step: the step of the checkpoint restored; None for a new run.
    data_position: training batches consumed before ``state`` (0 for a new run).
    input_shards: the input shards the checkpoint's run read (a resumed run keeps its
      input order whatever the hosts); None for a new run.
    frozen_stddevs: where the posterior stddevs were frozen at (``frozen_stddevs.load``'s
      record: the new run's, or the checkpoint's); None when they train.
  """
  state: TrainState
  restored_step: int | None
  data_position: int
  input_shards: int | None
  frozen_stddevs: dict[str, Any] | None = None


def _restore_or_initialize(ckpts: checkpoints_lib.Checkpoints, partitioner: Partitioner,
                           abstract: TrainState, fallback: bool,
                           check: Callable[[dict[str, Any], epath.Path], None],
                           initialize: Callable[[], tuple[TrainState, dict[str, Any] | None]]
                           ) -> _Start:
  """The latest checkpoint's state, checked by ``check(meta, step_dir)`` (with
  ``fallback``, the newest intact one, checked after reading), or ``initialize()``'s
  (a state, and where its frozen stddevs came from)."""
  latest = ckpts.latest_step()
  if latest is None:
    state, frozen = initialize()
    return _Start(state, None, 0, None, frozen)
  _say(f"resuming from the checkpoint of step {latest} in {ckpts.directory}")
  if not fallback:  # fail before reading the arrays
    try:
      meta = checkpoints_lib.read_meta(ckpts.step_dir(latest))
    except checkpoints_lib.CorruptCheckpointError as error:
      raise checkpoints_lib.CorruptCheckpointError(
          f"{error}{ckpts.past_corrupt(latest)}") from error
    check(meta, ckpts.step_dir(latest))
  latest, state, saved_meta = ckpts.restore_latest(partitioner.placed(abstract), fallback)
  if fallback:  # the step restored may be an older one
    check(saved_meta, ckpts.step_dir(latest))
  return _Start(state, latest, int(saved_meta["data_position"]),
                int(saved_meta.get("input_shards", 1)), saved_meta.get(frozen_stddevs.META_KEY))


def _initialize(model: BaseModel, steps: StepFunctions, data: TaskData,
                partitioner: Partitioner, abstract: TrainState, checkpoint: CheckpointConfig,
                seed: int) -> tuple[TrainState, dict[str, Any] | None]:
  """A new run's state: initialized from ``seed``, its parameters from
  ``checkpoint.initial_checkpoint`` when one is set, its posterior scales from
  ``checkpoint.frozen_stddevs_from`` when that is set (with the record of their source)."""
  source = None
  if checkpoint.frozen_stddevs_from is not None:  # its errors before anything is initialized
    source = frozen_stddevs.source(checkpoint.frozen_stddevs_from, checkpoint.frozen_stddevs_step)
  num_params = sum(x.size for x in jax.tree.leaves(abstract.params))
  _say(f"initializing the train state ({num_params:,} parameters) on a "
       f"{' x '.join(f'{k}={v}' for k, v in partitioner.mesh.shape.items())} mesh")
  state, _ = partitioner.init(
      lambda k: init_train_state(model, steps.optimizer, data.input_shapes(), k),
      jax.random.key(seed))
  if checkpoint.initial_checkpoint:
    state = _initial_parameters(state, abstract, checkpoint, partitioner)
  if source is None:
    return state, None
  params, record = frozen_stddevs.load(
      source, state.params, partitioner.placed({"params": abstract.params})["params"])
  _say(f"posterior stddevs frozen at {source.run}'s step {source.step} ({source.chosen_by})")
  return state.replace(params=params), record


def _checkpoint_meta(model: BaseModel, data: TaskData, steps: StepFunctions,
                     abstract: TrainState, vocabulary: str, host_input: HostInput,
                     frozen: dict[str, Any] | None) -> dict[str, Any]:
  """What every checkpoint of this start records beside its arrays (``frozen``: where the
  posterior stddevs are frozen at)."""
  meta = {"param_logical_axes": _param_axes(abstract), "input_shards": host_input.input_shards,
          "batch_size": data.batch_size, "vocabulary": vocabulary, "task": data.task}
  if getattr(model, "num_train_units", None) is not None:  # the KL's D, for evaluation
    meta["num_train_units"] = float(model.num_train_units)
  if steps.ivon is not None:  # what turns the saved state into the posterior
    meta[IVON_META] = {"ess": steps.ivon.ess, "weight_decay": steps.ivon.weight_decay}
  if frozen is not None:
    meta[frozen_stddevs.META_KEY] = frozen
  return meta


@dataclasses.dataclass(frozen=True)
class _Compiled:
  """The train step compiled for this start.

  Attributes:
    step_fn: ``(state, this host's batch) -> (state, metrics)``.
    batches: this host's training batches, after ``first_batch``.
    first_batch: the batch the step was compiled with: the first step's.
    configuration: the gin configuration of this start ('' without gin).
    started: when compilation began (``time.perf_counter``).
  """
  step_fn: Callable[..., tuple[TrainState, dict[str, jax.Array]]]
  batches: HostBatches
  first_batch: dict[str, np.ndarray]
  configuration: str
  started: float


def _compile(steps: StepFunctions, partitioner: Partitioner, shardings: Any,
             state: TrainState, batches: HostBatches, model_dir: epath.Path) -> _Compiled:
  """Compiles the train step on the first batch; records the start's configuration in
  ``configs/`` once it is known to work."""
  _say(f"compiling the train step (step {int(state.step) + 1})...")
  started = time.perf_counter()
  first_batch = next(batches)
  with partitioner.activation_rules():
    compiled = jit_train_step(steps, partitioner, shardings).lower(
        state, partitioner.global_batch(first_batch)).compile()

  def step_fn(state: TrainState, host_batch: dict[str, np.ndarray]):
    with partitioner.activation_rules():
      return compiled(state, partitioner.global_batch(host_batch))

  configuration = gin.config_str()
  if configuration and jax.process_index() == 0:
    (model_dir / "configs").mkdir(exist_ok=True)
    write_text_atomically(
        model_dir / "configs" / f"start-{int(state.step)}-{time.strftime('%Y%m%d-%H%M%S')}.gin",
        configuration)
  return _Compiled(step_fn, batches, first_batch, configuration, started)


@dataclasses.dataclass(frozen=True)
class _Schedule:
  """When the loop logs, evaluates and saves.

  Attributes:
    train_steps: the step the run trains to.
    log_period: steps between metric writes.
    checkpoint_period: steps between checkpoints (the last step is always saved).
    evaluation: the validation passes and early stopping.
  """
  train_steps: int
  log_period: int
  checkpoint_period: int
  evaluation: EvaluationConfig


@dataclasses.dataclass(frozen=True)
class _Outputs:
  """Where the loop's results go.

  Attributes:
    model_dir: the run's directory (``config.gin``, the early-stopping record).
    ckpts: its checkpoints.
    meta: what each checkpoint records beside its arrays (and its data position).
    saves_input: whether this host saves its input iterators' positions.
    writer: the training metrics.
    eval_writer: the validation passes' metrics.
    compute: this attempt's cost log (process 0; None on the others), which counts a
      checkpoint once its save has landed (``saves_landed``).
  """
  model_dir: epath.Path
  ckpts: checkpoints_lib.Checkpoints
  meta: dict[str, Any]
  saves_input: bool
  writer: MetricsWriter
  eval_writer: MetricsWriter
  compute: compute_log.ComputeLog | None

  @classmethod
  def open(cls, model_dir: epath.Path, ckpts: checkpoints_lib.Checkpoints,
           meta: dict[str, Any], saves_input: bool, cleanup: contextlib.ExitStack,
           first_step: int) -> _Outputs:
    """The writers opened (closed by ``cleanup``) and the compute log of this attempt,
    which starts at ``first_step``; at ``cleanup`` the save in progress lands and counts."""
    writer = MetricsWriter(model_dir / "train", model_dir / "metrics.jsonl")
    eval_writer = MetricsWriter(model_dir / "eval", model_dir / "eval" / "metrics.jsonl")
    cleanup.callback(writer.close)
    cleanup.callback(eval_writer.close)
    compute = None
    if jax.process_index() == 0:  # this attempt's cost beside the earlier ones'
      compute = compute_log.ComputeLog(model_dir, first_step)
    outputs = cls(model_dir, ckpts, meta, saves_input, writer, eval_writer, compute)
    cleanup.push(outputs._landed_at_exit)
    return outputs

  def saves_landed(self, until_now: bool = False) -> None:
    """Waits for the save in progress to land (``Checkpoints.wait``); the compute log then
    counts it, with the times of now when ``until_now`` (the attempt ends with it)."""
    self.ckpts.wait()
    if self.compute is not None:
      self.compute.save_landed(until_now)

  def _landed_at_exit(self, error_type, error, traceback) -> None:
    """At the attempt's end, on an error too, the save in progress counts once it has
    landed; not after a failed save (``Checkpoints.wait`` raises a failure only once)."""
    del error_type, traceback
    if not isinstance(error, checkpoints_lib.CheckpointError):
      self.saves_landed()


def _validation(steps: StepFunctions, partitioner: Partitioner, shardings: Any,
                data: TaskData, layout: Any) -> Callable[[TrainState], dict[str, float]]:
  """The validation pass: teacher-forced metrics and the posterior stddevs' medians."""
  eval_fn = jax.jit(steps.eval_step, in_shardings=(
      shardings.params, NamedSharding(partitioner.mesh, partitioner.batch_spec)))
  stddev_medians = jax.jit(lambda p, o: median_stddevs(steps.posterior_stddevs(p, o)))

  def evaluate(state: TrainState) -> dict[str, float]:
    metrics = teacher_forced_metrics(eval_fn, state.params, data.eval_batches(layout),
                                     partitioner)
    medians = jax.device_get(stddev_medians(state.params, state.opt_state))
    return metrics | {k: float(v) for k, v in medians.items()}

  return evaluate


@dataclasses.dataclass(frozen=True)
class _Due:
  """What the loop does at a step: log, evaluate, save, or stop on ``stop`` (a signal)."""
  logs: bool
  evaluates: bool
  saves: bool
  stop: int


def _train_loop(state: TrainState, start: _Start, compiled: _Compiled, schedule: _Schedule,
                outputs: _Outputs, evaluate: Callable[[TrainState], dict[str, float]],
                history: list[tuple[int, float]]) -> TrainState:
  """Trains ``state`` to ``schedule.train_steps`` (``step_loop.run_steps``), logging,
  evaluating with ``evaluate`` (stopping early on ``history``, the validation NLLs so far,
  extended), saving, and stopping on a signal or a non-finite step."""
  ckpts, model_dir, evaluation = outputs.ckpts, outputs.model_dir, schedule.evaluation
  patience, min_delta = evaluation.patience, evaluation.min_delta
  first = step = int(state.step)
  progress = ProgressBar(schedule.train_steps, first)
  STOP_SIGNALS.exit_at_once = False  # from the first new step on, a signal saves it
  # Metrics stay on the device until a step that logs, evaluates, saves or stops (the
  # loop's readings). Every step's loss is checked finite there, and a state before it is
  # saved (a non-finite state makes the next loss so).
  state_is_finite = jax.jit(lambda state: all_finite((state.params, state.opt_state)))
  window: list[dict[str, float]] = []
  window_start, window_tokens = time.perf_counter(), 0.0
  last_saved, stopped = start.restored_step, None
  # The first step's batch was read to compile the step.
  host_batches = itertools.chain([compiled.first_batch], compiled.batches)
  taken = 0

  def advance(state: TrainState, count: int) -> tuple[TrainState, dict[str, jax.Array]]:
    nonlocal taken, window_tokens
    del count  # one step per call
    host_batch = next(host_batches)
    state, metrics = compiled.step_fn(state, host_batch)
    taken += 1
    if taken > 1:  # the first step includes compilation: not throughput
      window_tokens += float(np.sum(host_batch["decoder_loss_weights"])) * jax.process_count()
    return state, metrics

  def due(step: int) -> _Due | None:
    now = _Due(logs=step % schedule.log_period == 0 or step == schedule.train_steps,
               evaluates=bool(evaluation.period) and step % evaluation.period == 0,
               saves=step % schedule.checkpoint_period == 0 or step == schedule.train_steps,
               stop=STOP_SIGNALS.received)
    if now.logs or now.evaluates or now.saves or now.stop or step == first + 1:
      return now
    return None

  # ``read_metrics`` looked up here, at the call: a test may replace the module's.
  for reading in step_loop.run_steps(advance, state, first_step=first,
                                     train_steps=schedule.train_steps, reads_at=due,
                                     read=read_metrics):
    state, step, now = reading.state, reading.step, reading.due
    saves, stop = now.saves, now.stop
    for done, values in reading.metrics:
      if not math.isfinite(values["loss"]):
        _stop_non_finite(done, values["loss"], bool(state_is_finite(state)), ckpts, last_saved)
      if done > first + 1:  # the first step includes compilation: not throughput
        window.append(values)
    if step == first + 1:
      window_start = time.perf_counter()
      progress.start_clock(step)
      _say(f"step {step} took {window_start - compiled.started:.1f} s (compilation "
           "included); training")
    if window and now.logs:
      seconds = time.perf_counter() - window_start
      logged = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
      logged.update(tokens_per_second=window_tokens / seconds,
                    step_seconds=seconds / len(window))
      outputs.writer.write(step, logged)
      progress.update(step, logged)
      window, window_tokens, window_start = [], 0.0, time.perf_counter()
    paused = time.perf_counter()  # evaluation and saving are not step time
    if now.evaluates:
      validation = evaluate(state)
      outputs.eval_writer.write(step, validation)
      if patience:
        history.append((step, validation["nll"]))
        stopped = early_stopping.stop_point(history, patience, min_delta)
        saves = saves or bool(stopped)
    if (saves or stop) and not state_is_finite(state):
      _stop_non_finite(step, values["loss"], False, ckpts, last_saved)
    if saves or stop:
      outputs.saves_landed()  # the previous save first (``save`` would wait for it too)
      ckpts.save(step, state, dict(outputs.meta, data_position=start.data_position + step - first),
                 compiled.batches.states() if outputs.saves_input else None)
      if last_saved in (None, first):  # this start's first checkpoint
        if compiled.configuration and jax.process_index() == 0:
          write_text_atomically(model_dir / "config.gin", compiled.configuration)
        if start.frozen_stddevs is not None and jax.process_index() == 0:  # beside config.gin
          write_text_atomically(model_dir / frozen_stddevs.RECORD_FILE, strict_json.dumps(
              start.frozen_stddevs, indent=2) + "\n")
      last_saved = step
      if outputs.compute is not None:  # counted once it has landed, not before
        outputs.compute.save_started(step)
    window_start += time.perf_counter() - paused
    if stopped:
      outputs.saves_landed(until_now=True)
      if jax.process_index() == 0:
        write_text_atomically(model_dir / early_stopping.STOP_FILE, strict_json.dumps(
            dict(dataclasses.asdict(stopped), patience=patience, min_delta=min_delta)))
      _say(f"stopped early at step {step}: {patience} validation passes without a better "
           f"NLL than step {stopped.best_step}'s {stopped.best_nll:.4f}; checkpoints in "
           f"{ckpts.directory}")
      return state
    if stop:
      outputs.saves_landed(until_now=True)
      _say(f"{signal.Signals(stop).name}: saved the checkpoint of step {step}; run again to "
           "resume")
      raise Preempted(STOP_EXIT_CODES[stop])
  # The final save has landed (or this raises) before the run says it is done.
  outputs.saves_landed(until_now=True)
  _say(f"trained to step {step}: checkpoints in {ckpts.directory}, metrics in "
       f"{model_dir / 'metrics.jsonl'} (TensorBoard: tensorboard --logdir {model_dir}, from "
       "the [tensorboard] extra: pip install -e '.[tensorboard]')")
  return state


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
