"""JSON as the standard defines it: no bare ``NaN`` or ``Infinity`` in what the project writes.

Python's ``json`` writes non-finite floats as ``NaN``/``Infinity``, which strict readers
(``jq``, JavaScript, most other languages) refuse. ``dumps`` writes each such value as
``null`` and, when asked, says why beside it: under ``null_reasons``, the value's path
and what it was.

>>> dumps({"auroc": float("nan"), "bins": [1.0, float("inf")]}, null_reasons="null_reasons")
'{"auroc": null, "bins": [1.0, null], "null_reasons": {"auroc": "nan: undefined on these items", "bins/1": "inf: not a finite number"}}'
>>> dumps({"x": float("nan")})
'{"x": null}'
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

# The key under which ``dumps`` lists the reason of each null (``restore`` reads it).
NULL_REASONS = "null_reasons"
# What a NaN figure usually means: a statistic with no items to measure (no positives,
# one class only, an empty bin).
NAN_REASON = "nan: undefined on these items"
Explain = Callable[[str, float], str]


def _default_reason(path: str, value: float) -> str:
  del path
  return NAN_REASON if math.isnan(value) else f"{value}: not a finite number"


def finite(tree: Any, explain: Explain = _default_reason, path: str = "",
           reasons: dict[str, str] | None = None) -> Any:
  """``tree`` with every non-finite number as None (numpy scalars and arrays as Python
  numbers and lists); each replaced value's ``path: explain(path, value)`` into
  ``reasons`` when given."""
  if isinstance(tree, Mapping):
    return {k: finite(v, explain, f"{path}{k}" if not path else f"{path}/{k}", reasons)
            for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [finite(v, explain, f"{path}/{i}" if path else str(i), reasons)
            for i, v in enumerate(tree)]
  if isinstance(tree, np.ndarray):
    return finite(tree.tolist(), explain, path, reasons)
  if isinstance(tree, np.generic):
    tree = tree.item()
  if isinstance(tree, numbers.Real) and not isinstance(tree, (bool, int)):
    value = float(tree)
    if not math.isfinite(value):
      if reasons is not None:
        reasons[path] = explain(path, value)
      return None
    return value
  return tree


def dumps(tree: Any, *, null_reasons: str | None = None, explain: Explain = _default_reason,
          **kwargs: Any) -> str:
  """``json.dumps`` that never writes ``NaN`` or ``Infinity``: each non-finite number is
  ``null``; with ``null_reasons`` (a key), a mapping ``tree`` has gains that key, listing
  the path of each such null and ``explain(path, value)`` (only when there is one).
  ``kwargs`` go to ``json.dumps`` (``indent``, ``sort_keys``)."""
  reasons: dict[str, str] = {}
  clean = finite(tree, explain, reasons=reasons)
  if null_reasons and reasons and isinstance(clean, dict):
    clean[null_reasons] = reasons
  return json.dumps(clean, allow_nan=False, **kwargs)


def loads_strict(text: str) -> Any:
  """``json.loads`` that refuses ``NaN``/``Infinity`` (a ValueError naming the constant)."""

  def refuse(constant: str) -> Any:
    raise ValueError(f"non-standard JSON constant {constant}")

  return json.loads(text, parse_constant=refuse)


def restore(tree: Any, key: str = NULL_REASONS) -> Any:
  """A JSON object read back as it was before ``strict_json`` wrote it: each null that
  ``tree[key]`` lists (``path: reason``) the non-finite number its reason begins with
  (``nan``, ``inf``, ``-inf``), and ``key`` removed (in place; ``tree`` returned). Anything
  else, and a file of bare ``NaN`` written before, as read.

  >>> restore({"nll": None, "a/b": [1.0, None], "null_reasons": {
  ...     "nll": "nan: undefined on these items", "a/b/1": "-inf: not a finite number"}})
  {'nll': nan, 'a/b': [1.0, -inf]}
  """
  reasons = tree.pop(key, None) if isinstance(tree, dict) else None
  for path, reason in (reasons or {}).items():
    try:
      value = float(str(reason).split(":", 1)[0])
    except ValueError:
      continue  # a reason that names no number: the null stays
    _restore(tree, path.split("/"), value)
  return tree


def _restore(node: Any, parts: list[str], value: float) -> bool:
  """Sets the null at ``parts`` below ``node`` to ``value``; whether there was one. A key
  may hold "/" itself (``metrics.jsonl``'s ``posterior_stddev_median/encoder/mlp``), so
  each split of the path is tried, the longest key first."""
  for length in range(len(parts), 0, -1):
    name = "/".join(parts[:length])
    if isinstance(node, dict) and name in node:
      child = name
    elif isinstance(node, list) and length == 1 and name.isdigit() and int(name) < len(node):
      child = int(name)
    else:
      continue
    rest = parts[length:]
    if not rest and node[child] is None:
      node[child] = value
      return True
    if rest and _restore(node[child], rest, value):
      return True
  return False
