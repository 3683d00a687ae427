"""Checkpoints restored onto other meshes (gradient accumulation: test_microbatches.py)."""

import jax
import numpy as np
import pytest

from meshbayes.training import checkpoints
from meshbayes.training.optimizers import LearningRate, Optimizer
from meshbayes.training.train_step import StepFunctions, init_train_state
from meshbayes.training.trainer import abstract_state
from meshbayes.models import EncoderDecoderModel
from meshbayes.models.configurables import preset_config
from meshbayes.partitioning import Partitioner

CONFIG = preset_config("tiny").replace(num_heads=4, head_dim=8)  # heads split 4 ways
MODEL = EncoderDecoderModel(CONFIG, num_train_units=1000)
SHAPES = {k: (8, 8) for k in ("encoder_input_tokens", "decoder_input_tokens",
                              "decoder_target_tokens", "decoder_loss_weights")}


def steps():
  optimizer = Optimizer("adamw", LearningRate("constant", 1e-2, 0))
  return StepFunctions(model=MODEL, optimizer=optimizer.transformation(),
                       learning_rate=optimizer.learning_rate, kl_weight=lambda s: 1.0)


# make test restores on two other meshes, one per rule set; the other two are slow.
@pytest.mark.parametrize("data, model, rules", [
    (4, 2, "megatron"), pytest.param(8, 1, "megatron", marks=pytest.mark.slow),
    (2, 4, "fsdp_tp"), pytest.param(1, 1, "megatron", marks=pytest.mark.slow)])
def test_saved_on_2x4_restores_identically_on_other_meshes(tmp_path, data, model, rules):
  fns = steps()
  init = lambda k: init_train_state(MODEL, fns.optimizer, SHAPES, k)
  saver = Partitioner(data=2, model=4, rules="megatron")
  state, _ = saver.init(init, jax.random.key(0))
  ckpts = checkpoints.Checkpoints(tmp_path / "checkpoints")
  ckpts.save(1, state, {"data_position": 1})
  ckpts.wait()

  devices = jax.devices()[:data * model]
  target = Partitioner(data=data, model=model, rules=rules, devices=devices)
  restored, meta = ckpts.restore(1, target.placed(abstract_state(MODEL, fns, SHAPES)))
  ckpts.close()
  assert meta["data_position"] == 1
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(restored)[0],
                          jax.tree.leaves(state)):
    np.testing.assert_array_equal(a, b, err_msg=str(path))
  query = restored.params["encoder"]["layers"]["attention"]["query"]["kernel_loc"]
  assert query.sharding.mesh.devices.size == data * model
  expected = target.shardings(abstract_state(MODEL, fns, SHAPES)).params
  assert query.sharding == expected["encoder"]["layers"]["attention"]["query"]["kernel_loc"]

