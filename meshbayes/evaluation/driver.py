"""Evaluation of a checkpoint (``python -m meshbayes.eval``): quality, calibration and
uncertainty on a split, each figure with a bootstrap interval over the split's sources.

``evaluate`` restores the run's parameters from the latest (or a given) checkpoint in
``MODEL_DIR`` (local or ``gs://``) onto the partitioner's mesh, builds the predictive
method's posterior (``evaluation.methods``), runs the passes (``evaluation.phases``) and
writes ``metrics.json``, reliability diagrams and each predictive's items, one set under its
manifest replacing the previous set (``evaluation.writer``), and TensorBoard scalars to
``ReportConfig.output_dir`` (default ``MODEL_DIR/eval/<task>/``).
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
from meshbayes.evaluation import items, methods, ood, phases, predictives, resumable, writer
from meshbayes.evaluation.settings import DecodeConfig, OodConfig, PredictiveConfig, ReportConfig
from meshbayes.evaluation.sources import Sources, group_sources
from meshbayes.training.teacher_forced import teacher_forced_metrics
from meshbayes.layers import as_posterior, holds_posterior
from meshbayes.metrics import measures, token_labels
from meshbayes.models.base import BaseModel
from meshbayes.partitioning import Partitioner
from meshbayes.training.checkpoint_restore import as_trained, restore_params

Predictive = predictives.Predictive


@dataclasses.dataclass(frozen=True)
class _Run:
  """What every pass of one evaluation reads: the model and its posterior, the data, the
  mesh, the key of samples, the passes' progress."""

  model: BaseModel
  params: Any
  data: TaskData
  partitioner: Partitioner
  rng: jax.Array
  progress: phases.EvalPhases


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
  _check_settings(decoding=(decoding, DecodeConfig), predictive=(predictive, PredictiveConfig),
                  ood_sets=(ood_sets, OodConfig), report=(report, ReportConfig))
  if predictive.beam_measures and decoding.enabled and decoding.method != "beam":
    raise ValueError(f"evaluate: PredictiveConfig.beam_measures=True needs "
                     f"DecodeConfig.method='beam', not {decoding.method!r}")
  if ood_sets.beam_sets and not (decoding.enabled and predictive.beam_measures):
    raise ValueError(f"evaluate: OodConfig.beam_sets={list(ood_sets.beam_sets)} need the "
                     "split decoded by beam search with PredictiveConfig.beam_measures=True")
  # The method checked against the run's metadata and config.gin before anything loads.
  method = methods.resolve_run(predictive.method_name, model, model_dir, checkpoint_step,
                               predictive.ensemble_dirs)
  partitioner = partitioner or Partitioner()
  model, params, step = _restored(model_dir, model, data, partitioner, checkpoint_step,
                                  predictive)
  split = split or data.eval_split
  variants = _variants(model, params, predictive.num_samples)
  has_mean = as_posterior(params).has_mean
  progress = phases.EvalPhases(_plan(data, split, variants, has_mean, decoding, predictive,
                                     ood_sets))
  run = _Run(model, params, data, partitioner, jax.random.key(predictive.seed), progress)
  batches = list(progress.track(data.eval_batches(partitioner.data_layout(data.batch_size),
                                                  split), f"reading {data.task}/{split}"))
  progress.split_batches = len(batches)
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
  sources = group_sources(batches, get_task(data.task).output_features["inputs"].vocabulary,
                          data.vocabulary)
  result.update(num_pairs=int((sources.row_source >= 0).sum()), num_sources=len(sources.texts),
                num_references=sum(map(len, sources.references)))
  out_dir = epath.Path(report.output_dir or epath.Path(model_dir) / "eval" / data.task)
  out_dir.mkdir(parents=True, exist_ok=True)
  # What a saved batch of decodes was decoded from: an evaluation resumes only its own.
  fingerprint = {"model_dir": str(model_dir), "step": step, "task": data.task, "split": split,
                 "batch_size": data.batch_size, "num_sources": len(sources.texts),
                 "decoding": dataclasses.asdict(decoding),
                 "predictive": dataclasses.asdict(predictive)}
  reliability, records, source_items = _figures(run, batches, sources, variants, decoding,
                                                predictive, report, out_dir, result,
                                                fingerprint)
  scores = _ood(run, sources, variants[0], ood_sets, report, result,
                records[variants[0].name], decoding.beam_size) if decoding.enabled else None
  progress.finish()  # before the lines saying where the results are, which come last
  # Written only now, the previous set replaced whole: a failed evaluation leaves it as it was.
  writer.write_results(out_dir, result, reliability, epath.Path(model_dir).name, source_items,
                       scores, {**fingerprint, "ood_sets": dataclasses.asdict(ood_sets),
                                "report": dataclasses.asdict(report)})
  resumable.remove(out_dir)
  return result


def _check_settings(**given: tuple[Any, type]) -> None:
  for name, (value, kind) in given.items():
    if not isinstance(value, kind):
      raise ValueError(f"evaluate: {name}={value!r} must be a {kind.__name__} "
                       f"(e.g. evaluate.{name} = @evaluation.{kind.__name__}())")


def _restored(model_dir: str, model: BaseModel, data: TaskData, partitioner: Partitioner,
              checkpoint_step: int | None, settings: PredictiveConfig
              ) -> tuple[BaseModel, Any, int]:
  """The run's model (its KL divisor the run's) and its method's posterior, and the step."""
  params, step = restore_params(model_dir, model, data, partitioner, checkpoint_step)
  trained = as_trained(model, data, model_dir, checkpoint_step)
  if settings.method_name is None:
    return trained, params, step
  inputs = methods.MethodInputs(
      str(model_dir), settings.num_samples, settings.ensemble_dirs,
      restore=lambda d: restore_params(d, trained, data, partitioner)[0],
      context=methods.EvalContext(data, partitioner, settings.seed))
  model, params = methods.get(settings.method_name).build(trained, params, inputs)
  return model, params, step


def _variants(model: BaseModel, params: Any, num_samples: int) -> list[Predictive]:
  """The predictives evaluated, the headline first (temperature scaling comes later)."""
  posterior = as_posterior(params)
  if not posterior.has_mean:
    return [Predictive("model_average", posterior.num_members(num_samples))]
  return predictives.predictives(model.is_bayesian or holds_posterior(params), num_samples)


def _teacher_forced(run: _Run, batches: list[dict[str, np.ndarray]], num_samples: int
                    ) -> dict[str, float]:
  partitioner = run.partitioner
  eval_fn = jax.jit(lambda p, b, k: run.model.eval_fn(p, b, k, num_samples)[1], in_shardings=(
      jax.tree.map(lambda x: x.sharding, run.params),
      NamedSharding(partitioner.mesh, partitioner.batch_spec), None))
  return teacher_forced_metrics(eval_fn, run.params, run.progress.track(
      batches, "teacher-forced pass"), partitioner, jax.random.fold_in(run.rng, 1))


def _temperature_scaled(run: _Run, variants: Sequence[Predictive], split: str,
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


def _figures(run: _Run, batches: list[dict[str, np.ndarray]], sources: Sources,
             variants: list[Predictive], decoding: DecodeConfig, predictive: PredictiveConfig,
             report: ReportConfig, out_dir: epath.Path, result: dict[str, Any],
             fingerprint: dict[str, Any]
             ) -> tuple[dict[str, dict[str, Any]], dict[str, list[predictives.Decoded]],
                        dict[str, items.SourceItems]]:
  """Each predictive's token calibration, decodes and figures with their intervals into
  ``result``; returns the reliability diagrams' curves, each predictive's decoded sources
  (none without decoding) and its items (for ``writer.write_results``)."""
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
  records = (_decode_sources(run, sources, variants, decoding, predictive, out_dir, fingerprint)
             if decoding.enabled else {})
  result["decoding"], result["intervals"] = {}, {}
  for variant in variants:
    source_items = all_items[variant.name] = _source_items(
        run.data, sources, token_statistics[variant.name], records.get(variant.name),
        report.num_bins)
    figures = items.intervals(source_items, report.bootstrap_resamples,
                              num_bins=report.num_bins)
    result["intervals"][variant.name] = items.as_json(figures)
    if source_items.decoded:
      result["decoding"][variant.name] = {
          "bleu_signature": metrics.corpus_bleu(source_items.predictions,
                                                source_items.references).signature,
          **{name: interval.estimate for name, interval in figures.items()
             if measures.get(name).level != measures.TOKEN}}
      reliability[variant.name]["sequence"] = metrics.equal_mass_reliability(
          np.clip(np.exp(source_items.log_probs), 0.0, 1.0), source_items.exact_match,
          report.num_bins)
  if decoding.enabled:
    headline = result["decoding"][variants[0].name]
    result.update(bleu=headline["bleu"], exact_match=headline["exact_match"],
                  sequence_ece=headline["sequence_ece"])
  return reliability, records, all_items


def _source_items(data: TaskData, sources: Sources, token_statistics: dict[str, np.ndarray],
                  decoded: list[predictives.Decoded] | None, num_bins: int
                  ) -> items.SourceItems:
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


def _decode_sources(run: _Run, sources: Sources, variants: list[Predictive],
                    decoding: DecodeConfig, predictive: PredictiveConfig, out_dir: epath.Path,
                    fingerprint: dict[str, Any]) -> dict[str, list[predictives.Decoded]]:
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
    unscaled = variant.name.removesuffix(predictives.TEMPERATURE_SCALED)
    rescored = records[unscaled] if unscaled != variant.name and unscaled in records else None
    outputs = None if rescored is None else [r.output_ids for r in rescored]
    samples = None if rescored is None or not predictive.equivalence_samples else [
        r.samples for r in rescored]
    records[variant.name] = predictives.decode_and_score(
        run.model, run.params, run.progress.track(
            in_batches(sources.inputs, data.batch_size), _decode_phase_name(data, variant,
                                                                            variants),
            math.ceil(len(sources.inputs) / data.batch_size)),
        run.partitioner, variant, run.rng, max_length=data.feature_lengths["targets"],
        eos_id=data.vocabulary.eos_id, outputs=outputs, method=decoding.method,
        beam_size=decoding.beam_size, sample_agreement=decoding.sample_agreement,
        beam_measures=predictive.beam_measures,
        equivalence_samples=predictive.equivalence_samples, samples=samples,
        done=log.done if log else (), on_batch=log.save if log else None)
  return records


def _ood(run: _Run, sources: Sources, headline: Predictive, settings: OodConfig,
         report: ReportConfig, result: dict[str, Any], decoded: list[predictives.Decoded],
         beam_size: int) -> items.OodScores | None:
  """The OOD sets' figures and intervals into ``result``; returns their scores (None
  without OOD sets)."""
  scores = ood.ood_scores(run.model, run.params, run.data, sources, run.partitioner,
                          headline, run.rng, run.progress, settings, decoded, beam_size)
  if scores is None:
    return None
  intervals = items.ood_intervals(scores, report.bootstrap_resamples)
  result["ood"] = {name: {"num_examples": len(next(iter(scores.out_of_domain[name].values()))),
                          **{k: v.estimate for k, v in per_measure.items()}}
                   for name, per_measure in intervals.items()}
  result["ood_intervals"] = items.as_json(intervals)
  return scores


def _plan(data: TaskData, split: str, variants: Sequence[Predictive], teacher_forced: bool,
          decoding: DecodeConfig, predictive: PredictiveConfig, ood_sets: OodConfig
          ) -> list[phases.Phase]:
  """The passes ``evaluate`` makes, in order, with their costs (``evaluation.phases``)."""
  Phase = phases.Phase  # pylint: disable=invalid-name
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
  if decoding.enabled:
    beam = decoding.beam_size if decoding.method == "beam" else 1
    for v in variants:
      rescoring = _rescores(v, variants)
      agreement = decoding.sample_agreement and v.num_samples
      plan.append(Phase(_decode_phase_name(data, v, variants), "score" if rescoring else
                        "decode", _passes(v) * ((1 if rescoring else beam) * (1 + agreement)
                                                + predictive.equivalence_samples)))
    if ood_sets.set_names:
      num_batches = math.ceil(ood_sets.max_examples / data.batch_size)
      plan += [Phase(f"decoding {name} (greedy)", "decode", _passes(variants[0]), num_batches)
               for name in (data.task, *ood_sets.set_names)]
      plan += [Phase(f"decoding {name} (beam)", "decode", _passes(variants[0]) * beam,
                     num_batches) for name in ood_sets.beam_sets]
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
