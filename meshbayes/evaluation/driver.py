"""Evaluation of a checkpoint (``python -m meshbayes.eval``): quality, calibration and
uncertainty on a split, each figure with a bootstrap interval over the split's sources.

``evaluate`` restores the run's parameters from the latest (or a given) checkpoint in
``MODEL_DIR`` (local or ``gs://``) onto the partitioner's mesh, builds the predictive
method's posterior (``evaluation.methods``), runs the passes (``evaluation.phases``; a
decoding's optional passes: ``evaluation.decode_passes``) and
writes ``metrics.json``, reliability diagrams and each predictive's items, one set under its
manifest replacing the previous set (``evaluation.writer``), and TensorBoard scalars to
``ReportConfig.output_dir`` (default ``MODEL_DIR/eval/<task>/``, or
``MODEL_DIR/eval/<task>/<split>/`` for a split other than the test and the task's
evaluation split: ``default_output_dir``).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.sharding import NamedSharding

from meshbayes import metrics
from meshbayes.data.pipeline import TaskData, get_task
from meshbayes.data.text_lines import in_batches
from meshbayes.evaluation import (decode_passes, items, methods, ood, phases, predictives,
                                  resumable, writer)
from meshbayes.evaluation.context import EvalRun, restored
from meshbayes.evaluation.decoding import Decoded, decode_and_score
from meshbayes.evaluation.settings import DecodeConfig, OodConfig, PredictiveConfig, ReportConfig
from meshbayes.evaluation.sources import Sources, group_sources
from meshbayes.training.teacher_forced import teacher_forced_metrics
from meshbayes.layers import as_posterior
from meshbayes.metrics import measures, token_labels
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner

Predictive = predictives.Predictive


@dataclasses.dataclass(frozen=True)
class _Settings:
  """An evaluation's grouped settings, as ``evaluate`` takes them."""

  decoding: DecodeConfig
  predictive: PredictiveConfig
  ood_sets: OodConfig
  report: ReportConfig


def evaluate(*, model_dir: str, model: BaseModel, data: TaskData,
             partitioner: Partitioner | None = None, checkpoint_step: int | None = None,
             split: str | None = None, decoding: DecodeConfig = DecodeConfig(),
             predictive: PredictiveConfig = PredictiveConfig(), ood_sets: OodConfig = OodConfig(),
             report: ReportConfig = ReportConfig()) -> dict[str, Any]:
  """Evaluates a checkpoint on a split: quality, calibration and uncertainty.

  Reports the posterior mean's teacher-forced metrics (NLL, accuracy, the plug-in and
  the Monte Carlo ELBO) and token calibration; decoded, per distinct source: BLEU,
  exact match, sequence calibration and error detection; with out-of-distribution
  sets, how well each uncertainty measure tells them from the split's inputs. A
  posterior is evaluated through its model average (the headline) and its mean.

  Args:
    model_dir: the run's directory.
    model: the model.
    data: the task (``eval_split`` unless ``split`` is given).
    partitioner: mesh and rules (default: data parallel).
    checkpoint_step: which checkpoint (default: the latest).
    split: the split to evaluate.
    decoding: whether and how the sources are decoded.
    predictive: the predictive method, its samples, temperature scaling.
    ood_sets: the out-of-distribution sets.
    report: calibration bins, bootstrap resamples, where the results go.

  Returns:
    The metrics (also in ``metrics.json``).
  """
  settings = _checked(decoding, predictive, ood_sets, report)
  # The method checked against the run's metadata and config.gin before anything loads.
  method = methods.resolve_run(predictive.method_name, model, model_dir, checkpoint_step,
                               predictive.ensemble_dirs)
  partitioner = partitioner or Partitioner()
  model, params, step = restored(model_dir, model, data, partitioner, checkpoint_step,
                                 predictive)
  split = split or data.eval_split
  variants = predictives.variants(model, params, predictive.num_samples)
  has_mean = as_posterior(params).has_mean
  run = EvalRun(model, params, data, partitioner, jax.random.key(predictive.seed),
                phases.EvalPhases(_plan(data, split, variants, has_mean, settings)))
  batches = list(run.progress.track(data.eval_batches(
      partitioner.data_layout(data.batch_size), split), f"reading {data.task}/{split}"))
  run.progress.split_batches = len(batches)
  result: dict[str, Any] = {"step": step, "method": method, "task": data.task, "split": split,
                            "num_samples": predictive.num_samples}
  if has_mean:
    result.update(_teacher_forced(run, batches, predictive.num_samples))
  else:  # a finite mixture: its members' average only
    result.update(num_samples=variants[0].num_samples,
                  ensemble=[str(model_dir), *predictive.ensemble_dirs])
  if predictive.temperature_scaling:
    variants += _temperature_scaled(run, variants, split, predictive, result)
  result["predictives"] = [v.name for v in variants]
  return _results(run, batches, variants, settings, result, str(model_dir))


def _checked(decoding: DecodeConfig, predictive: PredictiveConfig, ood_sets: OodConfig,
             report: ReportConfig) -> _Settings:
  """The settings, checked together before anything loads."""
  given = {"decoding": (decoding, DecodeConfig), "predictive": (predictive, PredictiveConfig),
           "ood_sets": (ood_sets, OodConfig), "report": (report, ReportConfig)}
  for name, (value, kind) in given.items():
    if not isinstance(value, kind):
      raise ValueError(f"evaluate: {name}={value!r} must be a {kind.__name__} "
                       f"(e.g. evaluate.{name} = @evaluation.{kind.__name__}())")
  if predictive.beam_measures and decoding.enabled and decoding.method != "beam":
    raise ValueError(f"evaluate: PredictiveConfig.beam_measures=True needs "
                     f"DecodeConfig.method='beam', not {decoding.method!r}")
  if ood_sets.beam_sets and not (decoding.enabled and predictive.beam_measures):
    raise ValueError(f"evaluate: OodConfig.beam_sets={list(ood_sets.beam_sets)} need the "
                     "split decoded by beam search with PredictiveConfig.beam_measures=True")
  return _Settings(decoding, predictive, ood_sets, report)


def _results(run: EvalRun, batches: list[dict[str, np.ndarray]], variants: list[Predictive],
             settings: _Settings, result: dict[str, Any], model_dir: str) -> dict[str, Any]:
  """The decoded figures and the OOD sets' into ``result``, every file written."""
  data = run.data
  sources = group_sources(batches, get_task(data.task).output_features["inputs"].vocabulary,
                          data.vocabulary)
  result.update(num_pairs=int((sources.row_source >= 0).sum()), num_sources=len(sources.texts),
                num_references=sum(map(len, sources.references)))
  out_dir = epath.Path(settings.report.output_dir or default_output_dir(
      model_dir, data.task, result["split"], data.eval_split))
  out_dir.mkdir(parents=True, exist_ok=True)
  # What a saved batch of decodes was decoded from: an evaluation resumes only its own.
  fingerprint = {"model_dir": model_dir, "step": result["step"], "task": data.task,
                 "split": result["split"], "batch_size": data.batch_size,
                 "num_sources": len(sources.texts),
                 "decoding": dataclasses.asdict(settings.decoding),
                 "predictive": dataclasses.asdict(settings.predictive)}
  reliability, records, all_items = _figures(run, batches, sources, variants, settings,
                                             out_dir, result, fingerprint)
  scores = _ood(run, sources, variants[0], settings, result,
                records[variants[0].name]) if settings.decoding.enabled else None
  run.progress.finish()  # before the lines saying where the results are, which come last
  # Written only now, the previous set replaced whole: a failed evaluation leaves it as it was.
  writer.write_results(out_dir, result, reliability, epath.Path(model_dir).name, all_items,
                       scores, {**fingerprint, "ood_sets": dataclasses.asdict(settings.ood_sets),
                                "report": dataclasses.asdict(settings.report)})
  resumable.remove(out_dir)
  return result


def default_output_dir(model_dir: str, task: str, split: str, eval_split: str) -> epath.Path:
  """Where an evaluation's results go without ``ReportConfig.output_dir``:
  ``MODEL_DIR/eval/<task>`` for the test split and the task's evaluation split (as
  always: ``compare_runs`` and the docs read it there), ``MODEL_DIR/eval/<task>/<split>``
  for any other (the pool's), so that its set never replaces the test split's.

  >>> str(default_output_dir("run", "tatoeba_enfr_20k", "pool_24000", "validation"))
  'run/eval/tatoeba_enfr_20k/pool_24000'
  """
  shared = epath.Path(model_dir) / "eval" / task
  return shared if split in ("test", eval_split) else shared / split


def _teacher_forced(run: EvalRun, batches: list[dict[str, np.ndarray]], num_samples: int
                    ) -> dict[str, float]:
  partitioner = run.partitioner
  eval_fn = jax.jit(lambda p, b, k: run.model.eval_fn(p, b, k, num_samples)[1], in_shardings=(
      jax.tree.map(lambda x: x.sharding, run.params),
      NamedSharding(partitioner.mesh, partitioner.batch_spec), None))
  return teacher_forced_metrics(eval_fn, run.params, run.progress.track(
      batches, "teacher-forced pass"), partitioner, jax.random.fold_in(run.rng, 1))


def _temperature_scaled(run: EvalRun, variants: Sequence[Predictive], split: str,
                        settings: PredictiveConfig, result: dict[str, Any]) -> list[Predictive]:
  """Each predictive at its own temperature, fitted on ``settings.temperature_split``:
  each fit in ``result['temperature_fits']`` under the scaled predictive's name, the
  headline's also as ``result['temperature_scaling']``."""
  fit_split = settings.temperature_split
  if fit_split == split:
    print(f"warning: the temperature is fitted on the evaluated split {split!r}",
          file=sys.stderr)
  scaled, fits = [], result.setdefault("temperature_fits", {})
  for index, variant in enumerate(variants):
    batches = run.data.eval_batches(run.partitioner.data_layout(run.data.batch_size), fit_split)
    temperature, fit = predictives.fit_temperature(
        run.model, run.params, run.progress.track(batches, _fitting_phase_name(fit_split,
                                                                               variant)),
        run.partitioner, variant, jax.random.fold_in(run.rng, 2 + index))
    scaled.append(variant.temperature_scaled(temperature))
    fits[scaled[-1].name] = {"split": fit_split, "temperature": temperature, **fit}
  result["temperature_scaling"] = fits[scaled[0].name]
  return scaled


def _fitting_phase_name(split: str, variant: Predictive) -> str:
  return f"fitting the temperature of {variant.name} on {split}"


def _figures(run: EvalRun, batches: list[dict[str, np.ndarray]], sources: Sources,
             variants: list[Predictive], settings: _Settings, out_dir: epath.Path,
             result: dict[str, Any], fingerprint: dict[str, Any]
             ) -> tuple[dict[str, dict[str, Any]], dict[str, list[Decoded]],
                        dict[str, items.SourceItems]]:
  """Each predictive's token calibration, decodes and figures with their intervals into
  ``result``; returns the reliability diagrams' curves, each predictive's decoded sources
  (none without decoding) and its items (for ``writer.write_results``)."""
  report = settings.report
  reliability, token_statistics, all_items = {}, {}, {}
  result["token_calibration"] = {}
  for variant in variants:
    token, per_row = predictives.token_calibration(
        run.model, run.params, run.progress.track(batches, f"token calibration "
                                                           f"({variant.name})"),
        run.partitioner, variant, run.rng, report.num_bins)
    token_statistics[variant.name] = sources.sum_rows(per_row)
    reliability[variant.name] = {"token": {k: v for k, v in token.items()
                                           if k.startswith("bin_")}}
    result["token_calibration"][variant.name] = {k: v for k, v in token.items()
                                                 if not k.startswith("bin_")}
  result["token_ece"] = result["token_calibration"][variants[0].name]["ece"]
  records = (_decode_sources(run, sources, variants, settings, out_dir, fingerprint)
             if settings.decoding.enabled else {})
  result["decoding"], result["intervals"] = {}, {}
  for variant in variants:
    predictive_items = all_items[variant.name] = source_items(
        run.data, sources, token_statistics[variant.name], records.get(variant.name),
        report.num_bins)
    figures = items.intervals(predictive_items, report.bootstrap_resamples,
                              num_bins=report.num_bins)
    result["intervals"][variant.name] = items.as_json(figures)
    if predictive_items.decoded:
      result["decoding"][variant.name] = {
          "bleu_signature": metrics.corpus_bleu(predictive_items.predictions,
                                                predictive_items.references).signature,
          **{name: interval.estimate for name, interval in figures.items()
             if measures.get(name).level != measures.TOKEN}}
      reliability[variant.name]["sequence"] = metrics.equal_mass_reliability(
          np.clip(np.exp(predictive_items.log_probs), 0.0, 1.0), predictive_items.exact_match,
          report.num_bins)
  if settings.decoding.enabled:
    headline = result["decoding"][variants[0].name]
    result.update(bleu=headline["bleu"], exact_match=headline["exact_match"],
                  sequence_ece=headline["sequence_ece"])
  return reliability, records, all_items


def source_items(data: TaskData, sources: Sources, token_statistics: dict[str, np.ndarray],
                 decoded: list[Decoded] | None, num_bins: int) -> items.SourceItems:
  """A predictive's items of ``sources``: its token statistics summed per source and, with
  ``decoded`` (one record per source), its detokenized outputs, their measures and decoded-token
  statistics against the closest reference, each figure's input (``items.intervals``)."""
  if decoded is None:
    return items.SourceItems(sources.texts, token_statistics)
  labels = [token_labels.closest_reference_labels(r.output_ids, references)
            for r, references in zip(decoded, sources.reference_ids)]
  # Each output token's probability (its EOS's left out); float32 rounding can pass 1.
  probabilities = [np.clip(np.exp(np.asarray(r.token_log_probs[:len(r.output_ids)])), 0, 1)
                   for r in decoded]
  return items.SourceItems(
      sources.texts, token_statistics, references=sources.references,
      predictions=[data.vocabulary.decode(list(r.output_ids)) for r in decoded],
      log_probs=np.array([r.log_prob for r in decoded]),
      num_tokens=np.array([r.num_tokens for r in decoded]),
      measures={name: np.array([r.measures[name] for r in decoded])
                for name in decoded[0].measures},
      decoded_token_statistics=token_labels.decoded_token_statistics(probabilities, labels,
                                                                     num_bins),
      # Samples detokenized as the outputs are, for the equivalence-class confidence.
      samples=[[data.vocabulary.decode(list(ids)) for ids in r.samples] for r in decoded]
      if decoded[0].samples else None,
      sample_log_probs=np.array([r.sample_log_probs for r in decoded], np.float64)
      if decoded[0].samples else None)


def _decode_sources(run: EvalRun, sources: Sources, variants: list[Predictive],
                    settings: _Settings, out_dir: epath.Path, fingerprint: dict[str, Any]
                    ) -> dict[str, list[Decoded]]:
  """Each source decoded once by each predictive (a temperature-scaled one rescores its
  unscaled self's outputs and equivalence samples): ``{predictive: records, one per
  source}``. Each batch is saved as it completes; an interrupted evaluation resumes there
  (``evaluation.resumable``)."""
  data, records = run.data, {}
  # One process: several would each need the same saved batches (a shared file system).
  saving = jax.process_count() == 1
  for variant in variants:
    log = resumable.DecodeLog(out_dir, variant.name, {
        **fingerprint, "variant": [variant.name, variant.num_samples, variant.temperature]}
    ) if saving else None
    if log is not None and log.done:
      print(f"resuming the decoding of {variant.name} after {len(log.done)} saved batches",
            flush=True)
    passes = _decode_passes(settings, variant, variants, records)
    if log is not None:
      passes += (decode_passes.Resumable(log.done, log.save),)
    records[variant.name] = decode_and_score(
        run.decoding(variant, method=settings.decoding.method,
                     beam_size=settings.decoding.beam_size),
        run.progress.track(in_batches(sources.inputs, data.batch_size),
                           _decode_phase_name(data, variant, variants),
                           math.ceil(len(sources.inputs) / data.batch_size)), passes)
  return records


def _decode_passes(settings: _Settings, variant: Predictive, variants: Sequence[Predictive],
                   records: dict[str, list[Decoded]]
                   ) -> tuple[decode_passes.DecodePass, ...]:
  """``variant``'s decode passes: the settings', and for a temperature-scaled predictive
  the rescoring of its unscaled self's outputs and samples (``records``; none yet: the
  plan's)."""
  passes = decode_passes.from_settings(settings.decoding, settings.predictive)
  if not _rescores(variant, variants):
    return passes
  rescored = records.get(variant.name.removesuffix(predictives.TEMPERATURE_SCALED), [])
  given = [decode_passes.RescoreOutputs([r.output_ids for r in rescored])]
  return tuple(given + [dataclasses.replace(p, given=[r.samples for r in rescored])
                        if isinstance(p, decode_passes.EquivalenceSamples) else p
                        for p in passes])


def _ood(run: EvalRun, sources: Sources, headline: Predictive, settings: _Settings,
         result: dict[str, Any], decoded: list[Decoded]) -> items.OodScores | None:
  """The OOD sets' figures and intervals into ``result``; returns their scores (None
  without OOD sets)."""
  scores = ood.ood_scores(run, sources, headline, settings.ood_sets, decoded,
                          settings.decoding.beam_size)
  if scores is None:
    return None
  intervals = items.ood_intervals(scores, settings.report.bootstrap_resamples)
  result["ood"] = {name: {"num_examples": len(next(iter(scores.out_of_domain[name].values()))),
                          **{k: v.estimate for k, v in per_measure.items()}}
                   for name, per_measure in intervals.items()}
  result["ood_intervals"] = items.as_json(intervals)
  return scores


def _plan(data: TaskData, split: str, variants: Sequence[Predictive], teacher_forced: bool,
          settings: _Settings) -> list[phases.Phase]:
  """The passes ``evaluate`` makes, in order, with their costs (``evaluation.phases``; a
  decoding's: ``decode_passes.plan_cost``)."""
  Phase = phases.Phase  # pylint: disable=invalid-name
  predictive, ood_sets = settings.predictive, settings.ood_sets
  unscaled = list(variants)
  variants = unscaled + ([v.temperature_scaled(1.0) for v in unscaled]
                         if predictive.temperature_scaling else [])
  plan = [Phase(f"reading {data.task}/{split}", "read")]
  if teacher_forced:
    plan.append(Phase("teacher-forced pass", "score", 1 + predictive.num_samples))
  if predictive.temperature_scaling:
    plan += [Phase(_fitting_phase_name(predictive.temperature_split, v), "score", _passes(v))
             for v in unscaled]
  plan += [Phase(f"token calibration ({v.name})", "score", _passes(v)) for v in variants]
  if not settings.decoding.enabled:
    return plan
  beam = settings.decoding.beam_size if settings.decoding.method == "beam" else 1
  plan += [Phase(_decode_phase_name(data, v, variants), *decode_passes.plan_cost(
      _decode_passes(settings, v, variants, {}), v, beam)) for v in variants]
  if ood_sets.set_names:
    num_batches = math.ceil(ood_sets.max_examples / data.batch_size)
    plan += [Phase(f"decoding {name} (greedy)", *decode_passes.plan_cost((), variants[0], 1),
                   num_batches) for name in (data.task, *ood_sets.set_names)]
    plan += [Phase(f"decoding {name} (beam)", *decode_passes.plan_cost(
        ood.BEAM_SET_PASSES, variants[0], beam), num_batches) for name in ood_sets.beam_sets]
  return plan


def _passes(variant: Predictive) -> int:
  return max(1, variant.num_samples)


def _rescores(variant: Predictive, variants: Sequence[Predictive]) -> bool:
  """Whether ``variant`` scores its unscaled self's outputs instead of decoding (a
  temperature rescales scores, not translations)."""
  unscaled = variant.name.removesuffix(predictives.TEMPERATURE_SCALED)
  return unscaled != variant.name and any(v.name == unscaled for v in variants)


def _decode_phase_name(data: TaskData, variant: Predictive,
                       variants: Sequence[Predictive]) -> str:
  return (f"{'scoring' if _rescores(variant, variants) else 'decoding'} {data.task} sources "
          f"({variant.name})")
