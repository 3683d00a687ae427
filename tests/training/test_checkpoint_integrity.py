"""Checkpoints that can be trusted: the newest always kept, corrupt array data never
restored, half-deleted step directories listed and removed."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from meshbayes.training import checkpoint_integrity, checkpoints
from meshbayes.tools import inspect_checkpoint
from tests.training import restore_fakes

W = np.random.default_rng(0).normal(size=(64, 128)).astype(np.float32)  # 32 KiB, incompressible


def state(step):
  return {"params": {"w": W + step, "b": np.arange(128, dtype=np.float32)},
          "step": np.int32(step)}


def abstract():
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                      state(0))


def saved(directory, steps=(2, 4), keep=None):
  ckpts = checkpoints.Checkpoints(directory, max_to_keep=keep)
  for step in steps:
    ckpts.save(step, state(step), {"data_position": step})
  ckpts.wait()
  return ckpts


def flip_a_byte(step_dir):
  """Flips a byte in the middle of the largest array data file (``w``'s chunk)."""
  files = [p for p in (Path(step_dir) / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  data_file = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(data_file.read_bytes())
  data[len(data) // 2] ^= 0x10
  data_file.write_bytes(bytes(data))


@pytest.mark.parametrize("keep", [0, -1, True, 2.0])
def test_keeping_no_checkpoint_is_refused_in_one_line(tmp_path, keep):
  with pytest.raises(ValueError) as error:
    checkpoints.Checkpoints(tmp_path / "checkpoints", max_to_keep=keep)
  assert str(error.value) == (f"checkpoints to keep ({keep!r}) must be a positive int, or None "
                              "to keep all")
  assert not (tmp_path / "checkpoints").exists()


def test_keeping_one_keeps_the_final_checkpoint(tmp_path):
  ckpts = saved(tmp_path / "checkpoints", steps=(1, 2, 3), keep=1)
  ckpts.close()
  assert ckpts.steps() == [3]
  assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["3"]


def test_checksums_do_not_depend_on_the_mesh_and_see_one_changed_element():
  expected = checkpoint_integrity.checksums(state(1))
  mesh = jax.make_mesh((2, 4), ("data", "model"))
  sharded = dict(state(1), params={
      "w": jax.device_put(W + 1, NamedSharding(mesh, PartitionSpec("data", "model"))),
      "b": jax.device_put(np.arange(128, dtype=np.float32), NamedSharding(mesh, PartitionSpec()))})
  assert checkpoint_integrity.checksums(sharded) == expected
  assert checkpoint_integrity.mismatches(expected, sharded) == []
  w = W + 1
  w[40, 100] = np.nextafter(w[40, 100], np.inf)  # one element, last bit
  changed = dict(state(1), params={"w": w, "b": np.arange(128, dtype=np.float32)})
  assert checkpoint_integrity.mismatches(expected, changed) == ["params/w"]
  swapped = dict(state(1), params={"w": (W + 1)[::-1], "b": np.arange(128, dtype=np.float32)})
  assert checkpoint_integrity.mismatches(expected, swapped) == ["params/w"]


def test_a_flipped_byte_is_one_line_naming_the_checkpoint_and_the_array(tmp_path):
  ckpts = saved(tmp_path / "checkpoints")
  np.testing.assert_array_equal(ckpts.restore(4, abstract())[0]["params"]["w"], W + 4)
  flip_a_byte(ckpts.step_dir(4))
  with pytest.raises(checkpoints.CorruptCheckpointError) as error:
    ckpts.restore(4, abstract())
  assert str(error.value) == (
      f"checkpoint {ckpts.step_dir(4)} is corrupt: array params/w does not match its checksum; "
      "to resume from the checkpoint before it (step 2), run again with "
      "--gin.run_configs.CheckpointConfig.fallback_on_corrupt=True, which sets the corrupt one "
      "aside")
  assert error.value.arrays == ("params/w",)
  for read in (checkpoints.read_arrays,
               lambda d: checkpoints.restore_subtree(d, {"params": abstract()["params"]})):
    with pytest.raises(checkpoints.CorruptCheckpointError, match="array params/w does not"):
      read(ckpts.step_dir(4))
  np.testing.assert_array_equal(checkpoints.restore_subtree(
      ckpts.step_dir(2), {"params": abstract()["params"]})["params"]["w"], W + 2)
  # Without being asked, nothing falls back and nothing is moved.
  with pytest.raises(checkpoints.CorruptCheckpointError, match=r"before it \(step 2\), run again "
                     r"with --gin\.run_configs\.CheckpointConfig\.fallback_on_corrupt=True"):
    ckpts.restore_latest(abstract())
  assert ckpts.steps() == [2, 4]
  ckpts.close()


def test_the_fallback_option_is_a_real_checkpoint_setting():
  import dataclasses

  from meshbayes.training import run_configs

  configurable, field = checkpoints.FALLBACK_BINDING.rsplit(".", 1)
  assert configurable == "run_configs.CheckpointConfig"
  assert field in {f.name for f in dataclasses.fields(run_configs.CheckpointConfig)}


def test_a_corrupt_first_checkpoint_says_how_to_start_over(tmp_path):
  ckpts = saved(tmp_path / "checkpoints", steps=(2,))
  flip_a_byte(ckpts.step_dir(2))
  with pytest.raises(checkpoints.CorruptCheckpointError) as error:
    ckpts.restore_latest(abstract())
  assert str(error.value).endswith(
      "does not match its checksum; no checkpoint precedes it: move it aside (or use a new "
      "MODEL_DIR) to train from the start")
  ckpts.close()


def test_no_checkpoint_says_what_writes_one(tmp_path):
  with pytest.raises(checkpoints.CheckpointError) as error:
    checkpoints.find_step_dir(tmp_path)
  assert str(error.value) == (
      f"no checkpoint in {tmp_path}: expected a model directory, its checkpoints/ directory or "
      "a checkpoint step directory; train first: meshbayes.train writes a run's checkpoints "
      "into its MODEL_DIR (make demo trains runs/demo/runs/bayesian and "
      "runs/demo/runs/deterministic)")


def test_eval_and_infer_are_told_the_complete_checkpoint_before_a_corrupt_one(tmp_path):
  """``restore_params`` (eval's and infer's restore) names the newest complete step before
  the corrupt one, skipping an incomplete one, and the tool that verifies them all."""
  from meshbayes.training import checkpoint_restore

  ckpts = saved(tmp_path / "checkpoints", steps=(2, 4, 6))
  ckpts.close()
  restore = lambda step=None: restore_fakes.restore(tmp_path, state(0)["params"], step)
  assert restore()[1] == 6
  flip_a_byte(tmp_path / "checkpoints" / "6")
  (tmp_path / "checkpoints" / "4" / "_CHECKPOINT_METADATA").unlink()  # incomplete
  with pytest.raises(checkpoint_restore.CorruptRunCheckpointError) as error:
    restore()
  assert str(error.value) == (
      f"checkpoint {tmp_path / 'checkpoints' / '6'} is corrupt: array params/w does not match "
      "its checksum; the checkpoint before it is step 2 (python -m "
      f"meshbayes.tools.inspect_checkpoint verify {tmp_path} checks every step)")
  assert (error.value.earlier_step, error.value.model_dir) == (2, str(tmp_path))
  np.testing.assert_array_equal(restore(2)[0]["w"], W + 2)
  flip_a_byte(tmp_path / "checkpoints" / "2")
  with pytest.raises(checkpoint_restore.CorruptRunCheckpointError) as error:
    restore(2)
  assert str(error.value).endswith("does not match its checksum; no complete checkpoint precedes "
                                   "it: train the run again (python -m meshbayes.tools."
                                   f"inspect_checkpoint verify {tmp_path} checks every step)")
  assert error.value.earlier_step is None


def test_asked_to_fall_back_it_sets_the_corrupt_one_aside_and_resumes_before_it(tmp_path,
                                                                                 capsys):
  ckpts = saved(tmp_path / "checkpoints")
  flip_a_byte(ckpts.step_dir(4))
  step, restored, meta = ckpts.restore_latest(abstract(), fallback=True)
  assert (step, meta) == (2, {"data_position": 2})
  np.testing.assert_array_equal(restored["params"]["w"], W + 2)
  assert capsys.readouterr().out == (
      f"checkpoint {ckpts.step_dir(4)} is corrupt: array params/w does not match its checksum; "
      "set aside as 4.corrupt, falling back to the checkpoint before it\n")
  assert ckpts.steps() == [2]
  assert (tmp_path / "checkpoints" / "4.corrupt" / "state").is_dir()
  ckpts.save(4, state(4), {"data_position": 4})  # the step is written again, not skipped
  ckpts.close()
  assert checkpoints.Checkpoints(tmp_path / "checkpoints").restore_latest(abstract())[0] == 4


def test_every_checkpoint_corrupt_is_an_error_even_with_fallback(tmp_path, capsys):
  ckpts = saved(tmp_path / "checkpoints", steps=(2,))
  flip_a_byte(ckpts.step_dir(2))
  with pytest.raises(checkpoints.CorruptCheckpointError) as error:
    ckpts.restore_latest(abstract(), fallback=True)
  assert str(error.value) == (f"every checkpoint in {ckpts.directory} is corrupt or incomplete "
                              "(set aside as 2.corrupt)")
  assert checkpoints.Checkpoints(tmp_path / "checkpoints").restore_latest(abstract()) is None


def test_a_checkpoint_without_checksums_restores_with_a_note(tmp_path, capsys):
  ckpts = saved(tmp_path / "checkpoints", steps=(2,))
  meta_file = ckpts.step_dir(2) / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  del meta[checkpoint_integrity.CHECKSUMS_KEY]
  meta_file.write_text(json.dumps(meta))
  restored, meta = ckpts.restore(2, abstract())
  ckpts.close()
  np.testing.assert_array_equal(restored["params"]["w"], W + 2)
  assert meta == {"data_position": 2}
  assert capsys.readouterr().out == (
      f"note: checkpoint {ckpts.step_dir(2)} has no checksums (saved before they were "
      "written); its arrays are not verified\n")


@pytest.mark.integration
def test_verify_reports_every_step_and_fails_on_a_corrupt_one(tmp_path, capsys):
  ckpts = saved(tmp_path / "checkpoints", steps=(2, 4, 6, 8))
  ckpts.close()
  root = tmp_path / "checkpoints"
  assert inspect_checkpoint.main(["verify", str(tmp_path)]) == 0
  assert capsys.readouterr().out.splitlines()[1:] == [f"  step {s:>8}  ok" for s in (2, 4, 6, 8)]
  flip_a_byte(root / "4")
  (root / "6" / "state" / "_METADATA").unlink()
  meta = json.loads((root / "8" / "meta" / "metadata").read_text())
  del meta[checkpoint_integrity.CHECKSUMS_KEY]
  (root / "8" / "meta" / "metadata").write_text(json.dumps(meta))
  assert inspect_checkpoint.main(["verify", str(tmp_path)]) == 1
  assert capsys.readouterr().out.splitlines() == [
      f"checkpoints in {root}:",
      f"  step        2  ok",
      f"  step        4  corrupt: params/w (checksum mismatch)",
      f"  step        6  incomplete (no state/_METADATA)",
      f"  step        8  no checksums (saved before they were written)"]


@pytest.mark.integration
def test_a_half_deleted_step_is_listed_as_incomplete_then_removed(tmp_path, capsys):
  ckpts = saved(tmp_path / "checkpoints", steps=(2, 4, 6))
  ckpts.close()
  root = tmp_path / "checkpoints"
  # A kill while orbax deleted step 2: its metadata and half its data are gone.
  (root / "2" / "_CHECKPOINT_METADATA").unlink()
  shutil.rmtree(root / "2" / "meta")
  for path in sorted((root / "2" / "state").rglob("*"))[::2]:
    if path.is_file():
      path.unlink()
  # The newest, incomplete (a save in flight on an object store), and a temporary one.
  (root / "8" / "state").mkdir(parents=True)
  (root / "10.orbax-checkpoint-tmp-1700000000" / "state").mkdir(parents=True)
  assert inspect_checkpoint.main(["list", str(tmp_path)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[1].startswith("  step        2  incomplete (no _CHECKPOINT_METADATA")
  assert lines[2].startswith("  step        4  (input position: 4 batches")
  assert lines[4].startswith("  step        8  incomplete (no _CHECKPOINT_METADATA")

  ckpts = checkpoints.Checkpoints(root)
  assert capsys.readouterr().out == (f"removed the incomplete checkpoint {root / '2'} "
                                     "(an interrupted deletion)\n")
  # The newest is left alone; the temporary directory is orbax's to clean up, in a
  # background thread, so whether it is still there is not ours to assert.
  assert sorted(p.name for p in root.iterdir() if ".orbax-checkpoint-tmp" not in p.name) == [
      "4", "6", "8"]
  ckpts.close()
