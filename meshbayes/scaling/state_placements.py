"""Where every array of a model's train state lives on a mesh, and its bytes per device.

Only shapes are computed (``jax.eval_shape``), so any preset is placed in
seconds; on a CPU machine the mesh's devices are simulated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from meshbayes import partitioning
from meshbayes.models import MLP
from meshbayes.models.configurables import preset_config
from meshbayes.models.encoder_decoder import EncoderDecoderModel

OPTIMIZERS = {
    "adamw": lambda: optax.adamw(1e-3),
    "adafactor": lambda: optax.adafactor(1e-3),
    "sgd": lambda: optax.sgd(1e-3, momentum=0.9),
}


def model_init(model: str, deterministic: bool, *, hidden: int = 1024, input_dim: int = 512,
               classes: int = 1024, batch: int = 8, length: int = 16
               ) -> Callable[[jax.Array], Any]:
  """A function from a PRNG key to the (boxed) parameters of ``model``: ``mlp`` (two hidden
  layers of ``hidden``, ``input_dim`` in, ``classes`` out) or a Transformer preset
  (``batch`` sequences of ``length`` tokens)."""
  if model == "mlp":
    estimators = (("deterministic",) * 3 if deterministic
                  else ("flipout", "local_reparameterization", "flipout"))
    mlp = MLP(hidden_dims=(hidden, hidden), num_classes=classes, estimators=estimators)
    inputs = jnp.zeros((batch, input_dim), jnp.float32)
    return lambda key: mlp.init(key, inputs)["params"]
  transformer = EncoderDecoderModel(preset_config(model, deterministic=deterministic),
                                    num_train_units=1)
  shapes = {name: (batch, length) for name in (
      "encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")}
  return lambda key: transformer.get_initial_variables(key, shapes)["params"]


def placement_table(model: str, mesh: tuple[int, int], rules: str, optimizer: str, *,
                    deterministic: bool = False, **sizes: int) -> str:
  """The table of every parameter and ``optimizer`` state array (``OPTIMIZERS``) of
  ``model`` (``model_init``'s, with its ``sizes``), placed on a ``(data, model)`` mesh (-1
  for one of them: the rest of the devices) by the ``rules`` preset: logical and mesh axes,
  total and per-device bytes, and the per-device totals. The mesh's CPU devices are
  simulated first, so JAX must not have started.

  Raises:
    ValueError: a dimension the mesh does not divide, a mesh the devices cannot hold, ...
  """
  data, model_size = mesh
  partitioning.simulate_cpu_devices(max(8, data * model_size))
  devices = jax.devices()
  if data != -1 and model_size != -1:
    devices = devices[:data * model_size]
  partitioner = partitioning.Partitioner(data=data, model=model_size, rules=rules,
                                         devices=devices)
  init_params = model_init(model, deterministic, **sizes)  # its arrays after the devices
  transform = OPTIMIZERS[optimizer]()

  def init_state(key):
    params = init_params(key)
    return {"params": params, "opt_state": transform.init(nn.unbox(params))}

  abstract = jax.eval_shape(init_state, jax.random.key(0))
  return partitioning.format_table(partitioner, partitioning.placements(partitioner, abstract))
