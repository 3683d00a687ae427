"""Evaluation of a checkpoint (``python -m meshbayes.eval``): quality, calibration and
uncertainty on a split, and the teacher-forced metrics the trainer reports.

The parameters are restored alone, placed on the partitioner's mesh, from the
latest (or a given) checkpoint in ``MODEL_DIR`` (local or ``gs://...``, through
``etils.epath``). Each pass over the data shows a progress bar on stderr.

The unit of every decoded figure is a distinct source: the split's pairs are
grouped by source, each source decoded once and scored against all of its
references; teacher-forced token figures use every pair, summed per source.
Every figure carries a bootstrap interval over the sources
(``meshbayes.evaluation_items``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.sharding import NamedSharding

from meshbayes import eval_phases, evaluation_items, metrics, predictive_eval, predictive_methods
from meshbayes.data import paths
from meshbayes.metrics import bootstrap, measures
from meshbayes.data.pipeline import TaskData, get_task
from meshbayes.field_checks import positive_int
from meshbayes.inference import (as_trained, encode_lines, in_batches, read_lines,
                                 restore_params)
from meshbayes.layers import as_posterior, holds_posterior
from meshbayes.metrics_writer import MetricsWriter, progress
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner


def teacher_forced_metrics(eval_fn, params: Any, batches: Iterable[dict[str, np.ndarray]],
                           partitioner: Partitioner, rng: jax.Array | None = None
                           ) -> dict[str, float]:
  """``eval_fn``'s metrics over ``batches``, weighted by their target tokens.

  ``eval_fn(params, batch)``, or ``eval_fn(params, batch, key)`` with a key per
  batch folded from ``rng``.
  """
  totals: dict[str, float] = {}
  num_tokens = 0.0
  with partitioner.activation_rules():
    for i, batch in enumerate(batches):
      keys = () if rng is None else (jax.random.fold_in(rng, i),)
      metrics = jax.device_get(eval_fn(params, partitioner.global_batch(batch), *keys))
      tokens = float(metrics["num_tokens"])
      for name, value in metrics.items():
        totals[name] = totals.get(name, 0.0) + float(value) * tokens
      num_tokens += tokens
  return {name: total / max(num_tokens, 1.0) for name, total in totals.items()
          if name != "num_tokens"} | {"num_tokens": num_tokens}


def _text(ids: Iterable[int], vocabulary: Any) -> str:
  return vocabulary.decode(predictive_eval.until_eos(ids, vocabulary.eos_id))


@dataclasses.dataclass(frozen=True)
class Sources:
  """A split's pairs grouped by source.

  Attributes:
    inputs: ``(n, input length)`` token ids of each distinct source, in order of first
      appearance.
    texts: each source's text.
    references: each source's distinct references (texts), in order of appearance.
    row_source: ``(rows,)`` the source of each row of the split's batches (-1: padding).
  """

  inputs: np.ndarray
  texts: list[str]
  references: list[list[str]]
  row_source: np.ndarray

  def sum_rows(self, per_row: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-row arrays summed over each source's rows: ``(n, ...)`` each."""
    present = self.row_source >= 0
    summed = {}
    for name, values in per_row.items():
      total = np.zeros((len(self.texts),) + values.shape[1:], np.float64)
      np.add.at(total, self.row_source[present], values[present])
      summed[name] = total
    return summed


def group_sources(batches: Sequence[Mapping[str, np.ndarray]], input_vocabulary: Any,
                  vocabulary: Any) -> Sources:
  """The distinct sources of ``batches`` (by their input tokens) and their references."""
  inputs = np.concatenate([b["encoder_input_tokens"] for b in batches])
  targets = np.concatenate([b["decoder_target_tokens"] for b in batches])
  present = np.flatnonzero(inputs.any(-1))
  unique, first, inverse = np.unique(inputs[present], axis=0, return_index=True,
                                     return_inverse=True)
  order = np.argsort(first)
  rank = np.empty_like(order)
  rank[order] = np.arange(order.size)
  row_source = np.full(len(inputs), -1)
  row_source[present] = rank[inverse.ravel()]
  references: list[list[str]] = [[] for _ in order]
  for row in present:
    reference = _text(targets[row], vocabulary)
    if reference not in references[row_source[row]]:
      references[row_source[row]].append(reference)
  return Sources(unique[order], [_text(ids, input_vocabulary) for ids in unique[order]],
                 references, row_source)


def _shuffled_words(texts: Sequence[str], seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.permutation(text.split())) for text in texts]


def _scalars(tree: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """The numbers of a nested result as ``{'a/b': value}`` (TensorBoard tags)."""
  found = {}
  for name, value in tree.items():
    if isinstance(value, Mapping):
      found.update(_scalars(value, f"{prefix}{name}/"))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
      found[f"{prefix}{name}"] = float(value)
  return found


def _jsonable(tree: Any) -> Any:
  """Per-bin arrays as lists, empty bins (NaN) as null."""
  if isinstance(tree, dict):
    return {k: _jsonable(v) for k, v in tree.items()}
  if isinstance(tree, np.ndarray):
    return [float(x) if np.isfinite(x) else None for x in tree.ravel()]
  return tree


def evaluate(*, model_dir: str, model: BaseModel, data: TaskData,
             partitioner: Partitioner | None = None, checkpoint_step: int | None = None,
             split: str | None = None, decode: bool = True, decode_method: str = "beam",
             beam_size: int = 4, num_samples: int = 4, num_bins: int = metrics.DEFAULT_NUM_BINS,
             ood_files: Mapping[str, str] | None = None, ood_shuffled_words: bool = False,
             ood_targets_as_inputs: bool = False,
             max_ood_examples: int = 1000, temperature_scaling: bool = False,
             temperature_split: str = "validation", method: str | None = None,
             ensemble_dirs: Sequence[str] = (), sample_agreement: bool = False,
             seed: int = 0, output_dir: str | None = None,
             bootstrap_resamples: int = bootstrap.DEFAULT_RESAMPLES
             ) -> dict[str, Any]:
  """Evaluates a checkpoint on a split: quality, calibration and uncertainty.

  Reports the posterior-mean teacher-forced metrics (NLL, accuracy, the
  plug-in and the Monte Carlo ELBO) and token-level calibration; when
  decoding, per distinct source: BLEU (sacrebleu, detokenized text, every
  reference of the source), exact match, sequence-level calibration by exact
  match (``metrics.sequence_calibration``) and error detection (the prediction
  rejection ratio of each uncertainty measure); with out-of-distribution
  inputs, the AUROC and FPR at 95% TPR of telling them from the split's inputs
  by each uncertainty measure (``meshbayes.predictive``). Every figure has a
  bootstrap interval (``intervals`` and ``ood_intervals``). A Bayesian model is
  evaluated through the model average of ``num_samples`` weight samples (the
  headline figures) and through its posterior mean.

  Writes to ``output_dir`` (default ``MODEL_DIR/eval/<task>/``): ``metrics.json``,
  ``reliability.json`` and ``reliability.png`` (token- and sequence-level
  reliability diagrams), each predictive's items (``predictions_<predictive>.jsonl``,
  ``token_statistics_<predictive>.npz``), ``ood_scores.npz`` (see
  ``evaluation_items``), and the metrics as TensorBoard scalars (tagged
  ``<split>/<name>``, at the checkpoint's step) with their JSON line in
  ``metrics.jsonl``.

  Args:
    model_dir: the run's directory.
    model: the model.
    data: the task (``eval_split`` unless ``split`` is given).
    partitioner: mesh and rules (default: data parallel).
    checkpoint_step: which checkpoint (default: the latest).
    split: the split to evaluate.
    decode: decode the split (BLEU, sequence calibration, OOD).
    decode_method: ``beam``, ``greedy`` or ``sample``.
    beam_size: beams for ``beam``.
    num_samples: weight samples of a Bayesian model's model average (0: the
      posterior mean only).
    num_bins: equal-width calibration bins.
    ood_files: name -> text file of out-of-distribution inputs, one per line
      (relative paths are relative to the data directory, ``make data``'s).
    ood_targets_as_inputs: also use the split's references (the target
      language: French for an English-French model) as inputs, an
      out-of-distribution set models tend to copy confidently.
    ood_shuffled_words: also use the split's inputs with their words shuffled
      as an out-of-distribution set.
    max_ood_examples: at most this many inputs per out-of-distribution set, and
      in-domain sources to compare them with (each decoded greedily).
    temperature_scaling: also evaluate the headline predictive temperature-scaled:
      one temperature fitted by teacher-forced NLL on ``temperature_split``
      (``predictive_eval.fit_temperature``), applied to token probabilities and
      to the scores of the unscaled predictive's outputs (it translates the
      same); reported as ``<predictive>_temperature_scaled``.
    temperature_split: the split the temperature is fitted on.
    method: the predictive method (``meshbayes.predictive_methods``; default: the
      run as trained, or ``ensemble`` with ``ensemble_dirs``). ``mc_dropout``
      evaluates a deterministic model's model average over ``num_samples``
      dropout masks (its training ``dropout_rate``, each mask shared by a
      sentence's positions, so the same masks decode and score; attention-weight
      dropout off, as its masks could not be), and its plain self as the
      posterior mean.
    ensemble_dirs: more runs of the same model (other seeds): with them, the
      latest checkpoints of ``model_dir`` and these are evaluated as one deep
      ensemble, a uniform mixture through the model-averaging path (its
      ``model_average`` over all members; ``num_samples`` must be > 0); the
      results go to ``model_dir``.
    sample_agreement: also decode with each of the model average's samples alone
      and report ``bleu_disagreement`` (100 minus their mean pairwise sentence
      BLEU) among the uncertainty measures, OOD report included (``S`` more
      decodes of every input).
    seed: seed of weight samples and sampling.
    output_dir: where the results go (default ``MODEL_DIR/eval/<task>``), so that
      several evaluations of one run (checkpoints, MC dropout, an ensemble) coexist.
    bootstrap_resamples: resamples of the bootstrap intervals (over sources).

  Returns:
    The metrics (also in ``metrics.json``).
  """
  positive_int("evaluate", "num_samples", num_samples, allow_zero=True)
  if not isinstance(bootstrap_resamples, int) or bootstrap_resamples < 1:
    raise ValueError(f"evaluate: bootstrap_resamples={bootstrap_resamples!r} must be an int "
                     ">= 1")
  partitioner = partitioner or Partitioner()
  params, step = restore_params(model_dir, model, data, partitioner, checkpoint_step)
  model = as_trained(model, data, model_dir, checkpoint_step)  # the KL divisor D is the run's
  method = method or ("ensemble" if ensemble_dirs else None)
  if method is not None:
    if ensemble_dirs and not predictive_methods.get(method).combines_runs:
      raise ValueError(f"evaluate: ensemble_dirs are given but method={method!r} predicts "
                       "with one run; drop them or use method='ensemble'")
    trained = model
    model, params = predictive_methods.get(method).build(
        model, params, predictive_methods.MethodInputs(
            str(model_dir), num_samples, tuple(ensemble_dirs),
            restore=lambda d: restore_params(d, trained, data, partitioner)[0],
            context=predictive_methods.EvalContext(data, partitioner, seed)))
  split = split or data.eval_split
  rng = jax.random.key(seed)
  variants = predictive_eval.predictives(model.is_bayesian or holds_posterior(params),
                                         num_samples)
  posterior = as_posterior(params)
  if not posterior.has_mean:  # a finite mixture: its members' average only
    variants = [predictive_eval.Predictive("model_average", posterior.num_members(num_samples))]
  ood_names = [*(ood_files or {}), *["targets_as_inputs"] * ood_targets_as_inputs,
               *["shuffled_words"] * ood_shuffled_words]  # _ood_scores' order
  phases = eval_phases.EvalPhases(_phases(
      data, split, variants, teacher_forced=posterior.has_mean,
      num_samples=num_samples, temperature_split=temperature_split if temperature_scaling
      else None, decode=decode, beam=decode_method == "beam" and beam_size,
      sample_agreement=sample_agreement, ood_names=ood_names,
      max_ood_examples=max_ood_examples))
  eval_fn = jax.jit(lambda p, b, k: model.eval_fn(p, b, k, num_samples)[1], in_shardings=(
      jax.tree.map(lambda x: x.sharding, params),
      NamedSharding(partitioner.mesh, partitioner.batch_spec), None))
  batches = list(phases.track(data.eval_batches(partitioner.data_layout(data.batch_size),
                                                split), f"reading {data.task}/{split}"))
  phases.split_batches = len(batches)
  result: dict[str, Any] = {"step": step, "task": data.task, "split": split,
                            "num_samples": num_samples}
  if not posterior.has_mean:
    result.update(num_samples=posterior.num_members(num_samples),
                  ensemble=[str(model_dir), *ensemble_dirs])
  else:
    result.update(teacher_forced_metrics(eval_fn, params, phases.track(
        batches, "teacher-forced pass"), partitioner, jax.random.fold_in(rng, 1)))
  if temperature_scaling:
    if temperature_split == split:
      print(f"warning: the temperature is fitted on the evaluated split {split!r}",
            file=sys.stderr)
    fit_batches = data.eval_batches(partitioner.data_layout(data.batch_size), temperature_split)
    temperature, fit = predictive_eval.fit_temperature(
        model, params, phases.track(fit_batches, f"fitting the temperature on "
                                                 f"{temperature_split}"),
        partitioner, variants[0], jax.random.fold_in(rng, 2))
    result["temperature_scaling"] = {"split": temperature_split, "temperature": temperature,
                                     **fit}
    variants.append(variants[0].temperature_scaled(temperature))
  result["predictives"] = [v.name for v in variants]
  sources = group_sources(batches, get_task(data.task).output_features["inputs"].vocabulary,
                          data.vocabulary)
  result.update(num_pairs=int((sources.row_source >= 0).sum()), num_sources=len(sources.texts),
                num_references=sum(map(len, sources.references)))
  reliability: dict[str, dict[str, Any]] = {}
  token_statistics: dict[str, dict[str, np.ndarray]] = {}
  result["token_calibration"] = {}
  for variant in variants:
    token, per_row = predictive_eval.token_calibration(
        model, params, phases.track(batches, f"token calibration ({variant.name})"), partitioner,
        variant, rng, num_bins)
    token_statistics[variant.name] = sources.sum_rows(per_row)
    reliability[variant.name] = {"token": {k: v for k, v in token.items()
                                           if k.startswith("bin_")}}
    result["token_calibration"][variant.name] = {k: v for k, v in token.items()
                                                 if not k.startswith("bin_")}
  result["token_ece"] = result["token_calibration"][variants[0].name]["ece"]
  out_dir = epath.Path(output_dir) if output_dir else epath.Path(model_dir) / "eval" / data.task
  out_dir.mkdir(parents=True, exist_ok=True)
  records = {}
  if decode:
    records = _decode_sources(model, params, data, sources, partitioner, variants, rng, phases,
                              method=decode_method, beam_size=beam_size,
                              sample_agreement=sample_agreement)
  result["decoding"], result["intervals"] = {}, {}
  for variant in variants:
    decoded = records.get(variant.name)
    items = evaluation_items.SourceItems(
        sources.texts, token_statistics[variant.name],
        **({} if decoded is None else dict(
            references=sources.references,
            predictions=[data.vocabulary.decode(list(r.output_ids)) for r in decoded],
            log_probs=np.array([r.log_prob for r in decoded]),
            num_tokens=np.array([r.num_tokens for r in decoded]),
            measures={name: np.array([r.measures[name] for r in decoded])
                      for name in decoded[0].measures})))
    figures = evaluation_items.intervals(items, bootstrap_resamples, num_bins=num_bins)
    result["intervals"][variant.name] = evaluation_items.as_json(figures)
    if items.decoded:
      result["decoding"][variant.name] = {
          "bleu_signature": metrics.corpus_bleu(items.predictions, items.references).signature,
          **{name: interval.estimate for name, interval in figures.items()
             if measures.get(name).level != measures.TOKEN}}
      reliability[variant.name]["sequence"] = metrics.equal_mass_reliability(
          np.clip(np.exp(items.log_probs), 0.0, 1.0), items.exact_match, num_bins)
    if jax.process_index() == 0:
      evaluation_items.write_items(items, out_dir, variant.name)
  if decode:
    headline = result["decoding"][variants[0].name]
    result.update(bleu=headline["bleu"], exact_match=headline["exact_match"],
                  sequence_ece=headline["sequence_ece"])
    ood = _ood_scores(model, params, data, sources, partitioner, variants[0], rng, phases,
                      ood_files or {}, ood_shuffled_words, ood_targets_as_inputs,
                      max_ood_examples)
    if ood is not None:
      ood_intervals = evaluation_items.ood_intervals(ood, bootstrap_resamples)
      result["ood"] = {name: {"num_examples": len(next(iter(ood.out_of_domain[name].values()))),
                              **{k: v.estimate for k, v in per_measure.items()}}
                       for name, per_measure in ood_intervals.items()}
      result["ood_intervals"] = evaluation_items.as_json(ood_intervals)
      if jax.process_index() == 0:
        evaluation_items.write_ood_scores(ood, out_dir)
  phases.finish()  # before the lines saying where the results are, which come last
  if jax.process_index() == 0:  # every process holds the same results
    (out_dir / "reliability.json").write_text(json.dumps(_jsonable(reliability)))
    with (out_dir / "reliability.png").open("wb") as png:
      metrics.plot_token_and_sequence_reliability(
          {f"{epath.Path(model_dir).name} ({name})": curves
           for name, curves in reliability.items()},
          png, title=f"{data.task}/{split}, step {step}")
    (out_dir / "metrics.json").write_text(json.dumps(_jsonable(result), indent=2))
    print(f"evaluated step {step} on {data.task}/{split}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float)))
    print(f"results in {out_dir} (metrics.json: every figure and its interval)", flush=True)
  writer = MetricsWriter(out_dir, out_dir / "metrics.jsonl")
  writer.write(step, {f"{split}/{name}": value for name, value in _scalars(result).items()
                      if name not in ("step", "num_samples")
                      and not name.startswith(("intervals/", "ood_intervals/"))})
  writer.close()
  return result


def _phases(data: TaskData, split: str, variants: Sequence[predictive_eval.Predictive], *,
            teacher_forced: bool, num_samples: int, temperature_split: str | None,
            decode: bool, beam: int, sample_agreement: bool, ood_names: Sequence[str],
            max_ood_examples: int) -> list[eval_phases.Phase]:
  """The passes ``evaluate`` makes, in order, with their costs (``eval_phases``)."""
  Phase = eval_phases.Phase  # pylint: disable=invalid-name
  variants = list(variants)
  if temperature_split is not None:
    variants.append(variants[0].temperature_scaled(1.0))
  phases = [Phase(f"reading {data.task}/{split}", "read")]
  if teacher_forced:
    phases.append(Phase("teacher-forced pass", "score", 1 + num_samples))
  if temperature_split is not None:
    phases.append(Phase(f"fitting the temperature on {temperature_split}", "score",
                        _passes(variants[0])))
  phases += [Phase(f"token calibration ({v.name})", "score", _passes(v)) for v in variants]
  if decode:
    for v in variants:
      rescoring = _rescores(v, variants)
      agreement = sample_agreement and v.num_samples
      phases.append(Phase(_decode_phase_name(data, v, variants), "score" if rescoring else
                          "decode", _passes(v) * (1 if rescoring else (beam or 1))
                          * (1 + agreement)))
    if ood_names:
      batches = math.ceil(max_ood_examples / data.batch_size)
      phases += [Phase(f"decoding {name} (greedy)", "decode", _passes(variants[0]), batches)
                 for name in (data.task, *ood_names)]
  return phases


def _passes(variant: predictive_eval.Predictive) -> int:
  return max(1, variant.num_samples)


def _rescores(variant: predictive_eval.Predictive,
              variants: Sequence[predictive_eval.Predictive]) -> bool:
  """Whether ``variant`` scores its unscaled self's outputs instead of decoding (a
  temperature rescales scores, not translations)."""
  unscaled = variant.name.removesuffix(predictive_eval.TEMPERATURE_SCALED)
  return unscaled != variant.name and any(v.name == unscaled for v in variants)


def _decode_phase_name(data: TaskData, variant: predictive_eval.Predictive,
                       variants: Sequence[predictive_eval.Predictive]) -> str:
  return (f"{'scoring' if _rescores(variant, variants) else 'decoding'} {data.task} sources "
          f"({variant.name})")


def _decode_sources(model: BaseModel, params: Any, data: TaskData, sources: Sources,
                    partitioner: Partitioner, variants: list[predictive_eval.Predictive],
                    rng: jax.Array, phases: eval_phases.EvalPhases, **decode_kwargs: Any
                    ) -> dict[str, list[predictive_eval.Decoded]]:
  """Each source decoded once by each predictive (a temperature-scaled one rescores its
  unscaled self's outputs): ``{predictive: records, one per source}``."""
  records: dict[str, list[predictive_eval.Decoded]] = {}
  for variant in variants:
    unscaled = variant.name.removesuffix(predictive_eval.TEMPERATURE_SCALED)
    outputs = ([r.output_ids for r in records[unscaled]]
               if unscaled != variant.name and unscaled in records else None)
    records[variant.name] = predictive_eval.decode_and_score(
        model, params, phases.track(in_batches(sources.inputs, data.batch_size),
                                    _decode_phase_name(data, variant, variants),
                                    math.ceil(len(sources.inputs) / data.batch_size)),
        partitioner, variant, rng, max_length=data.feature_lengths["targets"],
        eos_id=data.vocabulary.eos_id, outputs=outputs, **decode_kwargs)
  return records


def _ood_scores(model: BaseModel, params: Any, data: TaskData, sources: Sources,
                partitioner: Partitioner, headline: predictive_eval.Predictive, rng: jax.Array,
                phases: eval_phases.EvalPhases, ood_files: Mapping[str, str], ood_shuffled_words: bool,
                ood_targets_as_inputs: bool, max_ood_examples: int
                ) -> evaluation_items.OodScores | None:
  """The headline predictive's uncertainty measures of greedy outputs for as many in-domain
  sources as out-of-distribution inputs (like with like), and of each OOD set."""
  input_vocabulary = get_task(data.task).output_features["inputs"].vocabulary
  in_domain = sources.texts[:max_ood_examples]
  ood_inputs = {name: read_lines(paths.data_dir() / path, skip_empty=True)[:max_ood_examples]
                for name, path in ood_files.items()}
  if ood_targets_as_inputs:
    ood_inputs["targets_as_inputs"] = list(dict.fromkeys(
        r for refs in sources.references for r in refs))[:max_ood_examples]
  if ood_shuffled_words:
    ood_inputs["shuffled_words"] = _shuffled_words(in_domain, seed=0)
  if not ood_inputs:
    return None
  length = data.feature_lengths["inputs"]

  def scores(lines: Sequence[str], name: str) -> dict[str, np.ndarray]:
    records = predictive_eval.decode_and_score(
        model, params, phases.track(in_batches(encode_lines(lines, input_vocabulary, length,
                                                            source=name), data.batch_size),
                                    f"decoding {name} (greedy)",
                                    math.ceil(len(lines) / data.batch_size)),
        partitioner, headline, rng, max_length=data.feature_lengths["targets"],
        eos_id=data.vocabulary.eos_id, method="greedy")
    return {m: np.array([r.measures[m] for r in records]) for m in records[0].measures}

  return evaluation_items.OodScores(scores(in_domain, data.task), {
      name: scores(lines, name) for name, lines in ood_inputs.items()})
