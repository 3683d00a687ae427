"""Models built from meshbayes layers.

Models name the logical axes of their parameters and activations; they never
build meshes. The trainer sees them through ``BaseModel``.
"""

from models.base import BaseModel
from models.encoder_decoder import EncoderDecoderModel
from models.mlp import MLP
from models.transformer import Estimators, Transformer, TransformerConfig

__all__ = [
           "MLP",
           "BaseModel",
           "EncoderDecoderModel",
           "Estimators",
           "Transformer",
           "TransformerConfig",
]
