"""Registers the models with gin, for configuration files (the classes do not depend on gin).

Importing it makes ``models.TransformerConfig``, ``models.Estimators`` and
``models.EncoderDecoderModel`` configurable; the presets in ``gin_configs/models/`` bind them::

  include 'models/base.gin'
  models.Estimators.mlp = 'flipout'
"""

from collections.abc import Sequence

import gin

from meshbayes.gin_configs import DIRECTORY as GIN_CONFIGS
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import Estimators, TransformerConfig
from meshbayes.runtime.gin_preflight import quiet_search_misses

gin.external_configurable(TransformerConfig, module="models")
gin.external_configurable(Estimators, module="models")
gin.external_configurable(EncoderDecoderModel, module="models")

PRESETS = ("tiny", "small", "base", "large", "paper", "10b")


def preset_config(name: str, deterministic: bool = False, bindings: Sequence[str] = ()
                  ) -> TransformerConfig:
  """The ``TransformerConfig`` of a size preset in ``gin_configs/models/``.

  Parses with gin's global configuration, which it clears before and after.

  Args:
    name: one of ``PRESETS``.
    deterministic: include ``models/deterministic.gin`` (the baseline).
    bindings: extra gin bindings, e.g. ``["models.Estimators.mlp = 'flipout'"]``.
  """
  if name not in PRESETS:
    raise ValueError(f"preset_config: name={name!r} is not one of {', '.join(PRESETS)}")
  files = [GIN_CONFIGS / "models" / f"{name}.gin"]
  if deterministic:
    files.append(GIN_CONFIGS / "models" / "deterministic.gin")
  gin.clear_config()
  gin.add_config_file_search_path(str(GIN_CONFIGS))
  try:
    # The presets' includes (`models/transformer.gin`) are searched for on every search
    # path, the working directory first: gin logs an error for each one that lacks them.
    with quiet_search_misses():
      gin.parse_config_files_and_bindings([str(f) for f in files], list(bindings))
    return gin.get_configurable("models.TransformerConfig")()
  finally:
    gin.clear_config()
