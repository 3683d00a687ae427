"""Parameter counts of a model preset, deterministic and Bayesian, from shapes alone.

``jax.eval_shape`` computes no array, so the 10B preset costs nothing to count.
"""

from __future__ import annotations

from typing import Any

import jax

from meshbayes.layers import count_parameters
from meshbayes.models.configurables import preset_config
from meshbayes.models.encoder_decoder import EncoderDecoderModel

SHAPES = {name: (1, 8) for name in ("encoder_input_tokens", "decoder_input_tokens",
                                    "decoder_target_tokens", "decoder_loss_weights")}


def counts(config: Any) -> Any:
  """``layers.count_parameters`` of an encoder-decoder of ``config`` (a ``TransformerConfig``)."""
  model = EncoderDecoderModel(config, num_train_units=1)
  abstract = jax.eval_shape(lambda k: model.get_initial_variables(k, SHAPES), jax.random.key(0))
  return count_parameters(abstract["params"])


def preset_sizes(name: str) -> dict[str, Any]:
  """Preset ``name``'s config and its counts: the deterministic twin's parameters, the Bayesian
  model's weights and its variational parameters.

  Raises:
    RuntimeError: the deterministic twin's count is not the Bayesian model's deterministic
      equivalent.
  """
  config = preset_config(name)
  found = counts(config)
  twin = counts(preset_config(name, deterministic=True)).total
  if twin != found.deterministic_equivalent:
    raise RuntimeError(f"{name}: the deterministic twin has {twin:,} parameters, the Bayesian "
                       f"model's deterministic equivalent {found.deterministic_equivalent:,}")
  return {"config": config, "deterministic": found.deterministic_equivalent,
          "bayesian_weights": found.bayesian_weights, "variational": found.total}
