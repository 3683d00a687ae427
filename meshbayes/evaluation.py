"""Evaluation of a checkpoint (``python -m meshbayes.eval``): quality, calibration and
uncertainty on a split, and the teacher-forced metrics the trainer reports.

The parameters are restored alone, placed on the partitioner's mesh, from the
latest (or a given) checkpoint in ``MODEL_DIR`` (local or ``gs://...``, through
``etils.epath``). Each pass over the data shows a progress bar on stderr.
"""

from __future__ import annotations

import dataclasses
import functools
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

from meshbayes import metrics, predictive_eval
from meshbayes.data import paths
from meshbayes.data.pipeline import TaskData, get_task
from meshbayes.inference import encode_lines, in_batches, read_lines, restore_params
from meshbayes.layers import Ensemble, MCDropout, holds_posterior
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


def _mc_dropout(model: BaseModel, params: Any, num_samples: int) -> tuple[BaseModel, MCDropout]:
  """The model with attention-weight dropout off and its parameters as ``MCDropout``."""
  config = getattr(model, "config", None)
  if model.is_bayesian or holds_posterior(params) or num_samples < 1 or not getattr(
      config, "dropout_rate", 0) > 0:
    raise ValueError("evaluate: mc_dropout=True needs a deterministic run with dropout_rate > 0 "
                     f"and num_samples > 0 (num_samples={num_samples})")
  return (dataclasses.replace(model, config=config.replace(attention_dropout_rate=0.0)),
          MCDropout(params))


def _ensemble(params: Any, model_dir: str, ensemble_dirs: Sequence[str], model: BaseModel,
              data: TaskData, partitioner: Partitioner, num_samples: int) -> Ensemble:
  """``params`` and the latest parameters of ``ensemble_dirs`` as one ``Ensemble``."""
  if num_samples < 1:
    raise ValueError(f"evaluate: ensemble_dirs needs num_samples > 0 (the ensemble is "
                     f"averaged over all its members), not num_samples={num_samples}")
  members = [params] + [restore_params(d, model, data, partitioner)[0] for d in ensemble_dirs]
  for directory, member in zip([model_dir, *ensemble_dirs], members):
    if holds_posterior(member) or model.is_bayesian:
      raise ValueError(f"evaluate: ensemble member {directory} is not a deterministic model's "
                       "run; deep ensembles here are of deterministic models")
  return Ensemble.stack(members)


def _text(ids: Iterable[int], vocabulary: Any) -> str:
  return vocabulary.decode(predictive_eval.until_eos(ids, vocabulary.eos_id))


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
             temperature_split: str = "validation", ensemble_dirs: Sequence[str] = (),
             sample_agreement: bool = False, mc_dropout: bool = False,
             seed: int = 0, output_dir: str | None = None) -> dict[str, Any]:
  """Evaluates a checkpoint on a split: quality, calibration and uncertainty.

  Reports the posterior-mean teacher-forced metrics (NLL, accuracy, the
  plug-in and the Monte Carlo ELBO) and token-level calibration; when
  decoding, BLEU (sacrebleu, detokenized text), exact match and
  sequence-level calibration error; with out-of-distribution inputs, the AUROC
  and FPR at 95% TPR of telling them from the split's inputs by each
  uncertainty measure (``meshbayes.predictive``). A Bayesian model is evaluated through
  the model average of ``num_samples`` weight samples (the headline figures)
  and through its posterior mean.

  Writes to ``output_dir`` (default ``MODEL_DIR/eval/<task>/``): ``metrics.json``, ``reliability.json``
  and ``reliability.png`` (token- and sequence-level reliability diagrams),
  ``predictions_<predictive>.jsonl``, and the metrics as TensorBoard scalars
  (tagged ``<split>/<name>``, at the checkpoint's step) with their JSON line
  in ``metrics.jsonl``.

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
      beam scores; reported as ``<predictive>_temperature_scaled``.
    temperature_split: the split the temperature is fitted on.
    ensemble_dirs: more runs of the same model (other seeds): with them, the
      latest checkpoints of ``model_dir`` and these are evaluated as one deep
      ensemble, a uniform mixture through the model-averaging path (its
      ``model_average`` over all members; ``num_samples`` must be > 0); the
      results go to ``model_dir``.
    mc_dropout: evaluate a deterministic model with Monte Carlo dropout: its
      model average over ``num_samples`` dropout masks (its training
      ``dropout_rate``, each mask shared by a sentence's positions, so the same
      masks decode and score; attention-weight dropout off, as its masks could
      not be), and its plain self as the posterior mean.
    sample_agreement: also decode with each of the model average's samples alone
      and report ``bleu_disagreement`` (100 minus their mean pairwise sentence
      BLEU) among the uncertainty measures, OOD report included (``S`` more
      decodes of every input).
    seed: seed of weight samples and sampling.
    output_dir: where the results go (default ``MODEL_DIR/eval/<task>``), so that
      several evaluations of one run (checkpoints, MC dropout, an ensemble) coexist.

  Returns:
    The metrics (also in ``metrics.json``).
  """
  if not isinstance(num_samples, int) or num_samples < 0:
    raise ValueError(f"evaluate: num_samples={num_samples!r} must be an int >= 0")
  partitioner = partitioner or Partitioner()
  params, step = restore_params(model_dir, model, data, partitioner, checkpoint_step)
  if mc_dropout:
    model, params = _mc_dropout(model, params, num_samples)
  if ensemble_dirs:
    params = _ensemble(params, model_dir, ensemble_dirs, model, data, partitioner, num_samples)
  split = split or data.eval_split
  rng = jax.random.key(seed)
  eval_fn = jax.jit(lambda p, b, k: model.eval_fn(p, b, k, num_samples)[1], in_shardings=(
      jax.tree.map(lambda x: x.sharding, params),
      NamedSharding(partitioner.mesh, partitioner.batch_spec), None))
  batches = list(progress(data.eval_batches(partitioner.data_layout(data.batch_size), split),
                          f"reading {data.task}/{split}"))
  result: dict[str, Any] = {"step": step, "task": data.task, "split": split,
                            "num_samples": num_samples}
  if isinstance(params, Ensemble):  # no posterior mean: its members' average only
    result.update(num_samples=params.size, ensemble=[str(model_dir), *ensemble_dirs])
  else:
    result.update(teacher_forced_metrics(eval_fn, params, progress(
        batches, "teacher-forced pass"), partitioner, jax.random.fold_in(rng, 1)))
  variants = predictive_eval.predictives(model.is_bayesian or holds_posterior(params),
                                         num_samples)
  if isinstance(params, Ensemble):
    variants = [predictive_eval.Predictive("model_average", params.size)]
  if temperature_scaling:
    if temperature_split == split:
      print(f"warning: the temperature is fitted on the evaluated split {split!r}",
            file=sys.stderr)
    fit_batches = data.eval_batches(partitioner.data_layout(data.batch_size), temperature_split)
    temperature, fit = predictive_eval.fit_temperature(
        model, params, progress(fit_batches, f"fitting the temperature on {temperature_split}"),
        partitioner, variants[0], jax.random.fold_in(rng, 2))
    result["temperature_scaling"] = {"split": temperature_split, "temperature": temperature,
                                     **fit}
    variants.append(variants[0].temperature_scaled(temperature))
  result["predictives"] = [v.name for v in variants]
  reliability: dict[str, dict[str, Any]] = {}
  result["token_calibration"] = {}
  for variant in variants:
    token = predictive_eval.token_calibration(
        model, params, progress(batches, f"token calibration ({variant.name})"), partitioner,
        variant, rng, num_bins)
    reliability[variant.name] = {"token": {k: v for k, v in token.items()
                                           if k.startswith("bin_")}}
    result["token_calibration"][variant.name] = {k: v for k, v in token.items()
                                                 if not k.startswith("bin_")}
  result["token_ece"] = result["token_calibration"][variants[0].name]["ece"]
  out_dir = epath.Path(output_dir) if output_dir else epath.Path(model_dir) / "eval" / data.task
  out_dir.mkdir(parents=True, exist_ok=True)
  if decode:
    _decode_split(result, reliability, model, params, data, batches, partitioner, variants,
                  rng, num_bins, out_dir, ood_files or {}, ood_shuffled_words,
                  ood_targets_as_inputs, max_ood_examples,
                  method=decode_method, beam_size=beam_size, sample_agreement=sample_agreement)
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
  writer = MetricsWriter(out_dir, out_dir / "metrics.jsonl")
  writer.write(step, {f"{split}/{name}": value for name, value in _scalars(result).items()
                      if name not in ("step", "num_samples")})
  writer.close()
  return result


def _decode_split(result: dict[str, Any], reliability: dict[str, dict[str, Any]],
                  model: BaseModel, params: Any, data: TaskData, batches: list[dict[str, Any]],
                  partitioner: Partitioner, variants: list[predictive_eval.Predictive],
                  rng: jax.Array, num_bins: int, out_dir: epath.Path,
                  ood_files: Mapping[str, str],
                  ood_shuffled_words: bool, ood_targets_as_inputs: bool,
                  max_ood_examples: int, **decode_kwargs: Any
                  ) -> None:
  """Decodes the split with each predictive: BLEU and sequence calibration into
  ``result['decoding']``, the sequence reliability bins into ``reliability``, and
  the OOD report of the headline predictive into ``result['ood']``."""
  input_vocabulary = get_task(data.task).output_features["inputs"].vocabulary
  vocabulary = data.vocabulary
  inputs = np.concatenate([b["encoder_input_tokens"] for b in batches])
  targets = np.concatenate([b["decoder_target_tokens"] for b in batches])
  inputs, targets = inputs[inputs.any(-1)], targets[inputs.any(-1)]  # drop padding rows
  input_texts = [_text(ids, input_vocabulary) for ids in inputs]
  references = [_text(ids, vocabulary) for ids in targets]
  decode = functools.partial(predictive_eval.decode_and_score, model, params,
                             partitioner=partitioner, rng=rng,
                             max_length=data.feature_lengths["targets"],
                             eos_id=vocabulary.eos_id, **decode_kwargs)
  result["decoding"] = {}
  # A source with several references is decoded once.
  unique_inputs, first, inverse = np.unique(inputs, axis=0, return_index=True,
                                            return_inverse=True)
  num_batches = lambda rows: math.ceil(len(rows) / data.batch_size)
  for variant in variants:
    unique_records = decode(progress(in_batches(unique_inputs, data.batch_size),
                                     f"decoding {data.task}/{result['split']} ({variant.name})",
                                     num_batches(unique_inputs)), predictive=variant)
    records = [unique_records[i] for i in inverse.ravel()]
    predictions = [vocabulary.decode(list(r.output_ids)) for r in records]
    sequence = predictive_eval.sequence_metrics(predictions, references, records, num_bins)
    reliability[variant.name]["sequence"] = sequence.pop("reliability")
    result["decoding"][variant.name] = sequence
    rows = zip(input_texts, references, predictions, records)
    if jax.process_index() == 0:
      (out_dir / f"predictions_{variant.name}.jsonl").write_text("".join(
          json.dumps({"input": text, "target": reference, "prediction": prediction,
                      "log_prob": r.log_prob, **r.measures}) + "\n"
          for text, reference, prediction, r in rows))
  headline = result["decoding"][variants[0].name]
  result.update(bleu=headline["bleu"], sequence_accuracy=headline["exact_match"],
                sequence_calibration_error=headline["sequence_calibration_error"],
                num_decoded=headline["num_decoded"])
  # The OOD report compares like with like: greedy outputs of as many in-domain sources
  # as out-of-distribution inputs, scored by the headline predictive.
  sources = [input_texts[i] for i in np.sort(first)][:max_ood_examples]
  ood_inputs = {name: read_lines(paths.data_dir() / path, skip_empty=True)[:max_ood_examples]
                for name, path in ood_files.items()}
  if ood_targets_as_inputs:
    ood_inputs["targets_as_inputs"] = list(dict.fromkeys(references))[:max_ood_examples]
  if ood_shuffled_words:
    ood_inputs["shuffled_words"] = _shuffled_words(sources, seed=0)
  if ood_inputs:
    length = data.feature_lengths["inputs"]
    greedy = lambda lines, name: decode(
        progress(in_batches(encode_lines(lines, input_vocabulary, length, source=name),
                            data.batch_size), f"decoding {name} (greedy)", num_batches(lines)),
        predictive=variants[0], method="greedy")
    in_domain = greedy(sources, data.task)
    ood_records = {name: greedy(lines, name) for name, lines in ood_inputs.items()}
    result["ood"] = predictive_eval.ood_report(in_domain, ood_records)
