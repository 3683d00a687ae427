"""Models built from meshbayes layers.

Models name the logical axes of their parameters and activations; they never
build meshes.
"""

from models.mlp import MLP

__all__ = ["MLP"]
