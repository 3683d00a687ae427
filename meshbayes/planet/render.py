"""The pendulum's observation: a small grayscale image of its rod, drawn in JAX.

The rod runs from the centre ``ROD_LENGTH`` of the half-width, upright at ``theta = 0`` and
turning clockwise as ``theta`` grows (gym's picture), antialiased so the image is a smooth
function of the angle. Only the angle is drawn: the velocity must be inferred from a sequence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

ROD_LENGTH = 0.8  # of the half-width
ROD_HALF_WIDTH = 0.08  # of the half-width


def render(theta: Array, size: int) -> Array:
  """``(size, size, 1)`` float32 image in ``[0, 1]`` of the rod at angle ``theta``.

  >>> image = render(jnp.asarray(0.0), 16)
  >>> image.shape, float(image[1, 8, 0]) > 0.5, float(image[14, 8, 0])  # tip up, nothing below
  ((16, 16, 1), True, 0.0)
  """
  if size < 4:
    raise ValueError(f"render: size={size} must be at least 4 pixels")
  # Pixel centres on [-1, 1], y pointing up (row 0 is the top).
  coords = (jnp.arange(size, dtype=jnp.float32) + 0.5) / size * 2.0 - 1.0
  x = coords[None, :]
  y = -coords[:, None]
  tip_x, tip_y = ROD_LENGTH * jnp.sin(theta), ROD_LENGTH * jnp.cos(theta)
  # Distance from each pixel to the segment pivot-tip: projection clipped to the segment.
  along = jnp.clip((x * tip_x + y * tip_y) / (ROD_LENGTH ** 2), 0.0, 1.0)
  distance = jnp.hypot(x - along * tip_x, y - along * tip_y)
  pixel = 2.0 / size
  brightness = jnp.clip(1.0 - (distance - ROD_HALF_WIDTH) / pixel, 0.0, 1.0)
  return brightness[:, :, None].astype(jnp.float32)
