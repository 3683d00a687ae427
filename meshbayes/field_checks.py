"""Checks of settings' fields, with one message form for the whole project.

A settings dataclass checks its fields in ``__post_init__``; a bad value raises a
one-line ValueError naming the owner, the field, the value and what would be valid:

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Budget:
...   steps: int = 100
...   learning_rate: float = 1e-3
...   def __post_init__(self):
...     positive_ints("Budget", self, "steps")
...     positive_numbers("Budget", self, "learning_rate")
>>> Budget(steps=0)
Traceback (most recent call last):
ValueError: Budget: steps=0 must be a positive int
"""

from __future__ import annotations

import numbers
from typing import Any


def is_int(value: Any) -> bool:
  """An int that is not a bool (``True`` is an int to Python, not to a setting)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(owner: str, name: str, value: Any, allow_zero: bool = False) -> None:
  """Raises unless ``value`` is an int >= 1 (>= 0 with ``allow_zero``)."""
  if not is_int(value) or value < (0 if allow_zero else 1):
    kind = "non-negative" if allow_zero else "positive"
    raise ValueError(f"{owner}: {name}={value!r} must be a {kind} int")


def positive_number(owner: str, name: str, value: Any, allow_zero: bool = False) -> None:
  """Raises unless ``value`` is a real number > 0 (>= 0 with ``allow_zero``; NaN is not)."""
  if (not isinstance(value, numbers.Real) or isinstance(value, bool)
      or not (value >= 0 if allow_zero else value > 0)):
    kind = "non-negative" if allow_zero else "positive"
    raise ValueError(f"{owner}: {name}={value!r} must be a {kind} number")


def positive_ints(owner: str, settings: Any, *names: str, allow_zero: bool = False,
                  allow_none: bool = False) -> None:
  """``positive_int`` on each named field of ``settings`` (None passes with ``allow_none``)."""
  for name in names:
    value = getattr(settings, name)
    if not (allow_none and value is None):
      positive_int(owner, name, value, allow_zero)


def booleans(owner: str, settings: Any, *names: str) -> None:
  """Raises unless each named field of ``settings`` is True or False (not 0 or 1)."""
  for name in names:
    if not isinstance(getattr(settings, name), bool):
      raise ValueError(f"{owner}: {name}={getattr(settings, name)!r} must be True or False")


def positive_numbers(owner: str, settings: Any, *names: str, allow_zero: bool = False) -> None:
  """``positive_number`` on each named field of ``settings``."""
  for name in names:
    positive_number(owner, name, getattr(settings, name), allow_zero)
