"""The ELBO gradient's variance over weight-noise draws, per parameter group (issue 70).

``gradient_variance`` takes a loss of the parameters and a ``'sample'`` key (the batch,
the dropout masks and every other input held fixed) and differentiates it under
``num_draws`` keys: per parameter group (a parameter's path without layer indices,
``decoder/layers/mlp/wi/kernel_loc``) and per kind (``KINDS``) the mean over the
group's elements of each element's unbiased variance across the draws, and the squared
norm of the mean gradient (the signal of a signal-to-noise ratio). ``trainer_loss`` is
the trainer's ELBO of an ``EncoderDecoderModel`` (``train_step.gradients``: NLL + KL
weight x KL / N per loss unit) on one batch as such a loss; ``compare_estimators`` runs
it for each of ``rows(group_counts)`` on the same parameters, batch and keys, and
``markdown`` tabulates that (``tools/gradient_variance.py``, its command line, reads the
recipe and the batch).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from meshbayes.field_checks import positive_int
from meshbayes.layers import KL_COLLECTION, total_kl
from meshbayes.models.base import LOSS, per_loss_unit
from meshbayes.models.transformer.config import GROUPED, GROUPED_COMPONENTS

Array = jax.Array
# (params, sample key) -> the scalar loss whose gradient is measured.
Loss = Callable[[Any, Array], Array]

KINDS = ("attention_loc", "attention_scale", "mlp_loc", "mlp_scale", "embedding", "other")
_LAYER_INDEX = re.compile(r"^layers_\d+$")


def group_of(path: str) -> str:
  """A parameter's group: its ``/``-joined path with unscanned layer indices dropped
  (``encoder/layers_1/mlp/wo/kernel_scale`` -> ``encoder/layers/mlp/wo/kernel_scale``;
  scanned layers already share one array)."""
  return "/".join("layers" if _LAYER_INDEX.match(part) else part for part in path.split("/"))


def kind_of(group: str) -> str:
  """The kind (``KINDS``) of a group: attention (self and cross) or feed-forward weights,
  their posterior means (a deterministic kernel counts as one) or scales; the token
  embedding; the rest (norms, position biases, the logits)."""
  parts = group.split("/")
  if "token_embedder" in parts:
    return "embedding"
  block = ("attention" if any("attention" in p for p in parts[:-1])
           else "mlp" if "mlp" in parts[:-1] else None)
  if block is None:
    return "other"
  return f"{block}_{'scale' if parts[-1].endswith('_scale') else 'loc'}"


def gradient_moments(loss: Loss, params: Any, keys: Array) -> tuple[Any, Any]:
  """The mean gradient over ``keys`` and the summed squared deviations from it (Welford's
  update, float32, one draw at a time: memory of three gradients whatever the draws)."""

  def draw(carry, key):
    count, mean, m2 = carry
    grads = jax.grad(loss)(params, key)
    count = count + 1.0
    delta = jax.tree.map(lambda g, m: g.astype(jnp.float32) - m, grads, mean)
    mean = jax.tree.map(lambda m, d: m + d / count, mean, delta)
    m2 = jax.tree.map(lambda s, d, g, m: s + d * (g.astype(jnp.float32) - m),
                      m2, delta, grads, mean)
    return (count, mean, m2), None

  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  (_, mean, m2), _ = jax.lax.scan(draw, (jnp.zeros(()), zeros, zeros), keys)
  return mean, m2


def _summary(parts: Sequence[tuple[np.ndarray, np.ndarray]], num_draws: int) -> dict[str, Any]:
  """One group's figures from its arrays' ``(mean, m2)``."""
  size = sum(mean.size for mean, _ in parts)
  variance = sum(float(np.sum(m2, dtype=np.float64)) for _, m2 in parts) / (
      (num_draws - 1) * size)
  signal = sum(float(np.sum(np.square(mean, dtype=np.float64))) for mean, _ in parts)
  return {"num_elements": size, "variance": variance, "mean_gradient_sq_norm": signal,
          # Per element: the mean gradient's square over the variance (inf at no noise).
          "snr": signal / size / variance if variance > 0 else math.inf}


def gradient_variance(loss: Loss, params: Any, num_draws: int, seed: int = 0
                      ) -> dict[str, Any]:
  """The gradient's variance over ``num_draws`` sample keys, per group and per kind.

  Args:
    loss: ``loss(params, key)``, everything but the ``'sample'`` key held fixed.
    params: the parameters (unboxed), a nested dict.
    num_draws: how many keys (``jax.random.split(key(seed), num_draws)``); at least 2.
    seed: the keys' seed (the same seed gives every loss the same keys).

  Returns:
    ``{'num_draws', 'groups': {group: figures}, 'kinds': {kind: figures}}``, figures
    being ``num_elements``; ``variance``, the mean over the elements of each one's
    unbiased variance across the draws; ``mean_gradient_sq_norm``, the squared norm of
    the mean gradient (it exceeds the expected gradient's by ``num_elements x variance
    / num_draws`` on average); ``snr``, the latter per element over the former.
  """
  if not isinstance(num_draws, int) or isinstance(num_draws, bool) or num_draws < 2:
    raise ValueError(f"gradient_variance: num_draws={num_draws!r} must be an int >= 2 (a "
                     "variance needs two draws)")
  keys = jax.random.split(jax.random.key(seed), num_draws)
  mean, m2 = jax.jit(gradient_moments, static_argnums=0)(loss, params, keys)
  flat_mean = traverse_util.flatten_dict(jax.device_get(mean), sep="/")
  flat_m2 = traverse_util.flatten_dict(jax.device_get(m2), sep="/")
  groups: dict[str, list] = {}
  for path in sorted(flat_mean):
    groups.setdefault(group_of(path), []).append((flat_mean[path], flat_m2[path]))
  kinds: dict[str, list] = {}
  for group, parts in groups.items():
    kinds.setdefault(kind_of(group), []).extend(parts)
  return {"num_draws": num_draws,
          "groups": {g: _summary(parts, num_draws) for g, parts in groups.items()},
          "kinds": {k: _summary(kinds[k], num_draws) for k in KINDS if k in kinds}}


def trainer_loss(model: Any, batch: Mapping[str, Array], kl_weight: float,
                 dropout_key: Array) -> Loss:
  """The trainer's loss of an ``EncoderDecoderModel`` on ``batch`` (``loss_fn``: the
  negative ELBO per loss unit, its z-loss and label smoothing included), the dropout
  masks drawn from ``dropout_key`` in every call and the weight noise from the key given."""

  def loss(params: Any, sample_key: Array) -> Array:
    logits, state = model.module.apply(
        {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], enable_dropout=True,
        deterministic=not model.weight_noise, mutable=[KL_COLLECTION],
        rngs={"dropout": dropout_key, "sample": sample_key})
    # The sums loss_sums forms from the logits and KL (its own rng split is what differs).
    sums = model._sums(logits, total_kl(state), batch, kl_weight,  # pylint: disable=protected-access
                       model.label_smoothing)
    return per_loss_unit(sums[LOSS], sums)

  return loss


@dataclasses.dataclass(frozen=True)
class Row:
  """One estimator of the comparison.

  Attributes:
    name: its label in the table.
    estimator: ``'paper'`` (the model as configured), ``'deterministic'`` (the same
      parameters at their posterior mean: no weight noise, so no variance), or an
      estimator for every Bayesian attention and feed-forward component.
    num_weight_groups: the grouped reparameterization's ``k`` (None for the others).
  """

  name: str
  estimator: str
  num_weight_groups: int | None = None


def rows(group_counts: Sequence[int]) -> tuple[Row, ...]:
  """The comparison's rows: deterministic, the paper's, reparameterization (the grouped
  estimator at k = 1, bit for bit), then the grouped estimator at each of ``group_counts``."""
  return (Row("deterministic", "deterministic"), Row("paper", "paper"),
          Row("reparameterization", GROUPED, 1),
          *(Row(f"grouped k={k}", GROUPED, k) for k in group_counts))


def row_model(model: Any, row: Row) -> Any:
  """``model`` (an ``EncoderDecoderModel``) with ``row``'s estimator in each Bayesian
  attention and feed-forward component; the embedding and logits as configured."""
  if row.estimator == "paper":
    return model
  if row.estimator == "deterministic":
    return dataclasses.replace(model, weight_noise=False)
  estimators = model.config.estimators
  changed = {c: row.estimator for c in GROUPED_COMPONENTS
             if getattr(estimators, c) != "deterministic"}
  config = model.config.replace(estimators=dataclasses.replace(estimators, **changed),
                                num_weight_groups=row.num_weight_groups or 1)
  return dataclasses.replace(model, config=config)


def compare_estimators(model: Any, params: Any, batch: Mapping[str, Array], kl_weight: float,
                       group_counts: Sequence[int], num_draws: int, seed: int = 0,
                       say: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
  """``gradient_variance`` of each of ``rows(group_counts)``: the same parameters, batch,
  dropout masks and sample keys.

  Each row's kinds gain ``k_var_ratio``, ``k x Var(k) / Var(1)`` (the 1/k law holds at 1;
  grouped rows and reparameterization only), and ``relative_to_paper``, its variance over
  the paper's estimator's.

  Raises:
    ValueError: a group count that is not a positive divisor of the batch.
  """
  size = len(next(iter(batch.values())))
  for k in group_counts:
    positive_int("compare_estimators", "group count", k)
    if size % k:
      raise ValueError(f"compare_estimators: group count {k} does not divide the batch of "
                       f"{size} examples; use divisors of it")
  dropout_key = jax.random.fold_in(jax.random.key(seed), 1)
  results = []
  for row in rows(group_counts):
    loss = trainer_loss(row_model(model, row), batch, kl_weight, dropout_key)
    figures = gradient_variance(loss, params, num_draws, seed)
    say(f"{row.name}: " + ", ".join(f"{kind} {f['variance']:.3e}"
                                     for kind, f in figures["kinds"].items()))
    results.append({"estimator": row.name, "num_weight_groups": row.num_weight_groups,
                    **figures})
  by_name = {r["estimator"]: r["kinds"] for r in results}
  for result in results:
    k = result["num_weight_groups"]
    for kind, figures in result["kinds"].items():
      figures["k_var_ratio"] = (_ratio(k * figures["variance"],
                                       by_name["reparameterization"][kind]["variance"])
                                if k is not None else None)
      figures["relative_to_paper"] = _ratio(figures["variance"],
                                            by_name["paper"].get(kind, {}).get("variance", 0.0))
  return results


def _ratio(numerator: float, denominator: float) -> float:
  return numerator / denominator if denominator > 0 else math.nan


def markdown(results: Sequence[Mapping[str, Any]]) -> str:
  """The comparison as a markdown table: a row per kind and estimator."""
  number = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else (
      "inf" if math.isinf(x) else f"{x:.3g}")
  lines = ["| kind | estimator | elements | variance | SNR | k Var(k) / Var(1) | "
           "Var / Var(paper) |", "|---|---|---:|---:|---:|---:|---:|"]
  for kind in KINDS:
    for result in results:
      figures = result["kinds"].get(kind)
      if figures is not None:
        lines.append(f"| {kind} | {result['estimator']} | {figures['num_elements']:,} | "
                     f"{number(figures['variance'])} | {number(figures['snr'])} | "
                     f"{number(figures['k_var_ratio'])} | "
                     f"{number(figures['relative_to_paper'])} |")
  return "\n".join(lines) + "\n"
