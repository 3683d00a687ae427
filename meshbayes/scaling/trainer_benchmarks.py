"""The trainer's loop and its host input against its compiled step, and a resume's first step.

- ``pipeline_against_trainer``: the input pipeline against the trainer's
  consumption, for a demo's task (``tatoeba_enfr`` needs ``make data``).
- ``trainer_against_bare_step``: the trainer's steady-state step against the
  bare compiled step (``overhead``) and its host input alone (``input_seconds``).
- ``resume_at_step``: seconds to the first step of a resumed run, the input
  position restored from the checkpoint against skipping the consumed batches.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from meshbayes.scaling.aot import StepSpec, build_steps
from meshbayes.scaling.step_spec import (compiled_train_step, one_device_partitioner,
                                         random_batch, step_spec)

# The demos' settings (gin_configs/examples/): task, lengths, global batch, model preset and
# the config fields the example's model gin changes.
PIPELINE_DEMOS = {
    "tatoeba_enfr": dict(lengths=(24, 32), batch_size=32, model="tiny", overrides=(
        ("emb_dim", 128), ("num_heads", 4), ("head_dim", 32), ("mlp_dim", 256),
        ("vocab_size", 8000))),  # tatoeba_enfr_tiny_bayesian.gin (make demo)
    "synthetic_reverse": dict(lengths=(16, 16), batch_size=32, model="tiny",
                              overrides=()),  # tiny_synthetic_bayesian.gin (demo-synthetic)
}


def demo_input(task: str) -> tuple[Any, Any, Any, Any]:
  """A task's demo settings, its ``TaskData``, a data-parallel partitioner, this host's
  ``HostInput`` as the trainer builds it, and the demo's train-step spec."""
  from meshbayes.data import TaskData
  from meshbayes.training.host_input import HostInput
  from meshbayes.partitioning import Partitioner

  demo = PIPELINE_DEMOS[task]
  inputs, targets = demo["lengths"]
  data = TaskData(task=task, feature_lengths={"inputs": inputs, "targets": targets},
                  batch_size=demo["batch_size"])
  partitioner = Partitioner(rules="data_only")
  layout = partitioner.data_layout(data.batch_size)
  spec = StepSpec(model=demo["model"], overrides=demo["overrides"],
                  batch_size=demo["batch_size"], input_length=inputs, target_length=targets,
                  model_parallel=1, partitioning="data_only")
  return data, partitioner, HostInput(data, layout, input_shards=layout.num_shards), spec



def pipeline_against_trainer(task: str, seconds: float) -> dict[str, Any]:
  """Batches per second of the input pipeline against train steps per second of its demo."""
  _, partitioner, host_input, spec = demo_input(task)
  batches = host_input.train_batches()  # as the trainer reads
  for _ in range(5):
    next(batches)
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    partitioner.global_batch(next(batches))  # what the trainer does with each batch
    count += 1
  pipeline_rate = count / (time.perf_counter() - start)

  batch = partitioner.global_batch(next(batches))
  state, step_fn = compiled_train_step(spec, partitioner, batch)
  state, metrics = step_fn(state, batch)
  jax.block_until_ready(metrics)
  steps_done, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    state, metrics = step_fn(state, batch)
    float(metrics["loss"])  # the trainer reads the metrics every step
    steps_done += 1
  step_rate = steps_done / (time.perf_counter() - start)
  demo = PIPELINE_DEMOS[task]
  return {"batch_size": demo["batch_size"], "lengths": list(demo["lengths"]),
          "model": f"{demo['model']} {dict(demo['overrides'])}",
          "pipeline_batches_per_second": pipeline_rate, "train_steps_per_second": step_rate,
          "ratio": pipeline_rate / step_rate, "goal": "ratio >= 10"}



def trainer_overheads(steps: dict[str, int], batch_size: int, length: int, rounds: int
                      ) -> dict[str, Any]:
  """``trainer_against_bare_step`` for each preset of ``steps`` (preset: timed steps)."""
  report = {model: trainer_against_bare_step(model, n, batch_size, length, rounds)
            for model, n in steps.items()}
  report["goal"] = "overhead <= 0.03"
  return report


def trainer_against_bare_step(model_name: str, num_steps: int, batch_size: int, length: int,
                              rounds: int) -> dict[str, Any]:
  """Seconds per step of the trainer's loop and of its compiled step alone, same program."""
  from meshbayes.data import TaskData
  from meshbayes.training import trainer
  from meshbayes.training.host_input import HostInput
  from meshbayes.training.run_configs import CheckpointConfig

  spec = step_spec(model_name, batch_size, length, deterministic=False,
                   overrides=(("vocab_size", 128),))
  partitioner = one_device_partitioner()
  batch = random_batch(spec, np.random.default_rng(0), high=32)
  state, compiled = compiled_train_step(spec, partitioner, batch)

  def bare() -> float:
    nonlocal state
    state, metrics = compiled(state, batch)  # warm, and the last run's work is done
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(num_steps):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / num_steps

  data = TaskData(task="synthetic_reverse", feature_lengths={"inputs": length,
                  "targets": length}, batch_size=batch_size)

  def trained() -> float:
    with tempfile.TemporaryDirectory() as model_dir:
      # Step 1 compiles; steps 2..num_steps + 1 are the logged window.
      trainer.train(model_dir=model_dir, model=build_steps(spec)[0], data=data,
                    train_steps=num_steps + 1, partitioner=partitioner,
                    log_period=num_steps + 1,
                    checkpoint=CheckpointConfig(period=num_steps + 1, async_save=False))
      logged = json.loads((Path(model_dir) / "metrics.jsonl").read_text().splitlines()[0])
    return logged["step_seconds"]

  def host_input() -> float:
    layout = partitioner.data_layout(batch_size)
    batches = HostInput(data, layout, layout.num_shards).train_batches()
    jax.block_until_ready(partitioner.global_batch(next(batches)))
    start = time.perf_counter()
    for _ in range(num_steps):
      jax.block_until_ready(partitioner.global_batch(next(batches)))  # as the trainer's loop
    return (time.perf_counter() - start) / num_steps

  # Alternating, fastest of each (load only adds time).
  times: dict[str, list[float]] = {"trainer": [], "bare": [], "input": []}
  for _ in range(rounds):
    times["bare"].append(bare())
    with contextlib.redirect_stdout(sys.stderr):  # the JSON report owns stdout
      times["trainer"].append(trained())
    times["input"].append(host_input())
  fastest = {k: min(v) for k, v in times.items()}
  return {"steps": num_steps, "batch_size": batch_size, "length": length,
          "seconds": fastest, "median_seconds": {k: statistics.median(v) for k, v in times.items()},
          "overhead": fastest["trainer"] / fastest["bare"] - 1,
          "input_seconds": fastest["input"], "input_share": fastest["input"] / fastest["bare"]}


def resume_at_step(task: str, step: int) -> dict[str, Any]:
  """Seconds to the first train step of a resume at ``step`` of ``task``'s demo, by method."""
  from meshbayes.training import checkpoints

  data, partitioner, host_input, spec = demo_input(task)
  layout = host_input.layout
  start = time.perf_counter()
  batches = host_input.train_batches()
  for _ in range(step):
    next(batches)
  advance_seconds = time.perf_counter() - start
  expected = next(host_input.train_batches(start_batch=step))["encoder_input_tokens"]

  start = time.perf_counter()
  state, step_fn = compiled_train_step(spec, partitioner, partitioner.global_batch(
      {name: np.ones(shape, np.int32) for name, shape in data.input_shapes().items()}))
  compile_seconds = time.perf_counter() - start

  with tempfile.TemporaryDirectory() as tmp:
    ckpts = checkpoints.Checkpoints(Path(tmp) / "checkpoints", async_save=False)
    start = time.perf_counter()
    ckpts.save(step, {"dummy": np.zeros(1, np.float32)}, {"data_position": step},
               batches.states())
    ckpts.wait()
    save_seconds = time.perf_counter() - start
    step_dir = ckpts.step_dir(step)
    state_bytes = sum(len(b) for b in checkpoints.read_input_states(step_dir).values())
    methods = {
        "restored_state": lambda: host_input.train_batches(
            states=checkpoints.read_input_states(step_dir, host_input.state_names)),
        "skip_tf_data": lambda: data.train_dataset(layout).skip(step).as_numpy_iterator(),
        "skip_fallback": lambda: host_input.train_batches(start_batch=step)}
    seconds, same = {}, True
    for name, open_input in methods.items():
      start = time.perf_counter()
      batch = next(open_input())
      state, metrics = step_fn(state, partitioner.global_batch(batch))
      float(metrics["loss"])
      seconds[name] = time.perf_counter() - start
      same &= bool(np.array_equal(batch["encoder_input_tokens"], expected))
    ckpts.close()
  return {"task": task, "step": step, "batch_size": data.batch_size,
          "seconds_to_first_step": seconds,
          "speedup_vs_skip_tf_data": seconds["skip_tf_data"] / seconds["restored_state"],
          "same_first_batch": same, "input_state_bytes": state_bytes,
          "checkpoint_save_seconds": save_seconds, "compile_seconds": compile_seconds,
          "advance_seconds": advance_seconds,
          "methods": {"restored_state": "the checkpoint's iterator state (this version)",
                      "skip_tf_data": "ds.skip(step) in tf.data (the previous version)",
                      "skip_fallback": "batches read and dropped (checkpoints without a "
                                       "state)"}}
