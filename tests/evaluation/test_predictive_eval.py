"""The evaluation passes against direct computations with the model's own functions."""

import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes import metrics, predictive
from meshbayes.evaluation import decode_passes, decoding
from meshbayes.evaluation import predictives as predictive_eval
from meshbayes.evaluation.decode_passes import (BeamMeasures, EquivalenceSamples,
                                                RescoreOutputs, Resumable, SampleAgreement)
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import TransformerConfig
from meshbayes.partitioning import Partitioner
from tests.models.synthetic import EOS, make_batch

CONFIG = TransformerConfig(vocab_size=16, emb_dim=16, num_heads=2, head_dim=8,
                           num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                           dropout_rate=0.0)
MODEL = EncoderDecoderModel(CONFIG, num_train_units=1000)
LENGTH = 6


def decoder(params, inputs, partitioner, predictive, rng=jax.random.key(1), **options):
  """``decode_and_score(passes)`` of ``inputs`` with the test model and these options."""
  context = decoding.DecodeContext(MODEL, params, partitioner, predictive, rng, LENGTH, EOS,
                                   options)
  return lambda *passes: decoding.decode_and_score(context, inputs, passes)


@pytest.fixture(scope="module")
def setup():
  batches = [make_batch(np.random.default_rng(i), 8, LENGTH, 16) for i in range(2)]
  batches[1] = {k: np.concatenate([v[:5], np.zeros_like(v[5:])]) for k, v in batches[1].items()}
  partitioner = Partitioner(data=8, model=1)
  shapes = {k: v.shape for k, v in batches[0].items()}
  params, _ = partitioner.init(lambda k: MODEL.get_initial_variables(k, shapes)["params"],
                               jax.random.key(0))
  return partitioner, params, batches


def test_temperature_nll_is_minimized_at_the_targets_temperature():
  """Targets drawn from softmax(z / T0): the NLL of softmax(z / T) is minimized at T = T0
  (20,000 tokens, 16 classes, logits of stddev 3), and the refined grid finds it."""
  logits = 3 * jax.random.normal(jax.random.key(0), (20_000, 16))
  log_probs = jax.nn.log_softmax(logits)
  for true_temperature in (0.5, 2.0):
    targets = jax.random.categorical(jax.random.key(1), logits / true_temperature)
    grid = predictive_eval.TEMPERATURE_GRID
    nll = predictive_eval.temperature_nll_sums(log_probs, targets, jnp.ones(20_000),
                                               jnp.asarray(grid)) / 20_000
    fitted = predictive_eval.best_temperature(grid, np.asarray(nll))
    assert abs(fitted / true_temperature - 1) < 0.03, (true_temperature, fitted)
    direct = -jnp.take_along_axis(jax.nn.log_softmax(log_probs / grid[3]), targets[:, None],
                                  -1).mean()
    np.testing.assert_allclose(nll[3], direct, rtol=1e-5)


def test_fit_temperature_on_the_model_matches_a_dense_search(setup):
  """The fit over batches (sharded, summed) lands where a dense search over T of the
  directly computed NLL does; score_batch at T gives the rescaled distribution."""
  partitioner, params, batches = setup
  unboxed = nn.unbox(params)
  score = jax.jit(functools.partial(MODEL.score_batch, return_log_probs=True))
  # Targets from the model's own distribution at T0 = 2, so that the optimum is inside.
  batches = [dict(b, decoder_target_tokens=np.where(b["decoder_loss_weights"] > 0, np.asarray(
      jax.random.categorical(jax.random.key(i), score(unboxed, b)[1]["log_probs"] / 2.0)), 0))
             for i, b in enumerate(batches)]
  variant = predictive_eval.Predictive("posterior_mean")
  temperature, fit = predictive_eval.fit_temperature(MODEL, params, batches, partitioner,
                                                     variant, jax.random.key(0))
  assert fit["tokens"] == sum(b["decoder_loss_weights"].sum() for b in batches)
  assert not fit["at_grid_edge"]

  def nll(t):
    total = sum(float(-(np.take_along_axis(np.asarray(jax.nn.log_softmax(
        score(unboxed, b)[1]["log_probs"] / t)), b["decoder_target_tokens"][..., None], -1)[
            ..., 0] * b["decoder_loss_weights"]).sum()) for b in batches)
    return total / fit["tokens"]
  dense = np.exp(np.linspace(np.log(temperature) - 0.2, np.log(temperature) + 0.2, 21))
  assert nll(temperature) <= min(nll(t) for t in dense) + 1e-4
  scaled = jax.jit(functools.partial(MODEL.score_batch, return_log_probs=True,
                                     calibration_temperature=temperature))(
      unboxed, batches[0])[1]["log_probs"]
  np.testing.assert_allclose(scaled, jax.nn.log_softmax(
      score(unboxed, batches[0])[1]["log_probs"] / temperature), atol=1e-5)
  # A traced temperature: one program for every T, T = 1 leaving the scores as they are.
  at = lambda t: score(unboxed, batches[0], calibration_temperature=np.float32(t))[1]
  np.testing.assert_allclose(at(temperature)["log_probs"], scaled, atol=1e-6)
  np.testing.assert_array_equal(at(1.0)["log_probs"], score(unboxed, batches[0])[1]["log_probs"])
  np.testing.assert_array_equal(at(1.0)["token_entropy"],
                                score(unboxed, batches[0])[1]["token_entropy"])


def test_predictives():
  assert predictive_eval.predictives(True, 4) == [
      predictive_eval.Predictive("model_average", 4), predictive_eval.Predictive("posterior_mean")]
  assert predictive_eval.predictives(False, 4) == [predictive_eval.Predictive("posterior_mean")]
  with pytest.raises(ValueError, match="num_samples=0"):
    predictive_eval.Predictive("model_average", 0)
  scaled = predictive_eval.Predictive("model_average", 4).temperature_scaled(1.3)
  assert scaled == predictive_eval.Predictive("model_average_temperature_scaled", 4, 1.3)
  with pytest.raises(ValueError, match="temperature=1.3 must be positive, and 1 unless"):
    predictive_eval.Predictive("posterior_mean", 0, 1.3)


@pytest.mark.parametrize("num_samples", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_token_calibration_sums_the_batches(setup, num_samples):
  partitioner, params, batches = setup
  variant = predictive_eval.predictives(True, num_samples)[0]
  rng = jax.random.key(5)
  result, per_row = predictive_eval.token_calibration(MODEL, params, batches, partitioner,
                                                      variant, rng)
  per_batch = []
  unboxed = nn.unbox(params)
  score = jax.jit(functools.partial(MODEL.score_batch, num_samples=num_samples,
                                    return_log_probs=True))
  for i, batch in enumerate(batches):
    _, aux = score(unboxed, batch, jax.random.fold_in(rng, i))
    per_batch.append(metrics.token_calibration_statistics(
        aux["log_probs"], batch["decoder_target_tokens"], batch["decoder_loss_weights"]))
  expected = metrics.token_calibration_metrics(metrics.sum_statistics(per_batch))
  assert result["tokens"] == sum(b["decoder_loss_weights"].sum() for b in batches)
  for name in ("ece", "weighted_ece", "brier", "nll", "accuracy"):
    np.testing.assert_allclose(result[name], expected[name], rtol=1e-5, atol=1e-6)
  # Per row: each row's own statistics (a row alone as a batch), padding rows zero.
  rows = np.concatenate([b["decoder_loss_weights"] for b in batches])
  assert per_row["tokens"].shape == (16,)
  np.testing.assert_array_equal(per_row["tokens"], rows.sum(-1))
  _, aux = score(unboxed, batches[0], jax.random.fold_in(rng, 0))
  alone = metrics.token_calibration_statistics(
      aux["log_probs"][2:3], batches[0]["decoder_target_tokens"][2:3],
      batches[0]["decoder_loss_weights"][2:3])
  for name, value in alone.items():
    np.testing.assert_allclose(per_row[name][2], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # decodes and scores a trained model (half a minute)
def test_decode_and_score_reports_each_outputs_probability(setup):
  partitioner, params, batches = setup
  variant = predictive_eval.Predictive("model_average", 2)
  inputs = [b["encoder_input_tokens"] for b in batches]
  records = decoder(params, inputs, partitioner, variant, method="greedy")(SampleAgreement())
  assert len(records) == 13  # padding rows skipped
  unboxed = nn.unbox(params)
  # Rescore the first batch's outputs with the model's own score_batch.
  key = jax.random.fold_in(jax.random.key(1), 0)  # decoded and scored with the same key
  tokens, decoded = jax.jit(functools.partial(
      MODEL.predict_batch_with_aux, method="greedy", num_samples=2, max_length=LENGTH))(
          unboxed, {"encoder_input_tokens": inputs[0]}, key)
  score = jax.jit(functools.partial(MODEL.score_batch, num_samples=2))
  for row in range(8):
    output = decoding.until_eos(np.asarray(tokens[row]), EOS)
    assert records[row].output_ids == tuple(output)
    targets = np.zeros((1, LENGTH), np.int32)
    ids = (output + [EOS])[:LENGTH]
    targets[0, :len(ids)] = ids
    batch = {"encoder_input_tokens": inputs[0][row:row + 1], "decoder_target_tokens": targets,
             "decoder_input_tokens": np.pad(targets[:, :-1], [(0, 0), (1, 0)]),
             "decoder_loss_weights": (targets > 0).astype(np.float32)}
    log_prob, aux = score(unboxed, batch, key)
    # Each row's weight samples come from the same key, so a row scores alike alone.
    np.testing.assert_allclose(records[row].log_prob, float(log_prob[0]), rtol=1e-4)
    # ... and the score is the one the decoder's weight samples gave the output.
    np.testing.assert_allclose(records[row].log_prob, float(decoded["scores"][row]), rtol=1e-4)
    assert records[row].num_tokens == len(ids)
    np.testing.assert_allclose(records[row].mutual_information,
                               float(aux["token_mutual_information"].sum()) / len(ids),
                               rtol=1e-3, atol=1e-7)
    assert records[row].log_prob <= 0
    measures = records[row].measures
    assert set(measures) == set(predictive.TOKEN_MEASURES + predictive.SEQUENCE_MEASURES
                                + ("bleu_disagreement",))
    np.testing.assert_allclose(measures["reverse_mutual_information"],
                               float(aux["token_reverse_mutual_information"].sum()) / len(ids),
                               rtol=1e-3, atol=1e-7)
    alone = [decoding.until_eos(np.asarray(jax.jit(
        lambda p, b, i: MODEL.predict_batch_with_aux(
            p, b, key, method="greedy", num_samples=2, max_length=LENGTH, sample_index=i)[0])(
                unboxed, {"encoder_input_tokens": inputs[0]}, s)[row]), EOS) for s in range(2)]
    np.testing.assert_allclose(measures["bleu_disagreement"],
                               100 - predictive_eval.pairwise_bleu(alone), atol=1e-9)
    sample_log_probs = np.asarray(aux["sample_log_probs"][:, 0], np.float64)  # (S=2,)
    np.testing.assert_allclose(measures["sequence_data_uncertainty"],
                               -sample_log_probs.mean() / len(ids), rtol=1e-4)


def test_a_temperature_scaled_predictive_scores_its_unscaled_outputs(setup):
  """Temperature scaling changes the scores, never the translation: given the unscaled
  predictive's outputs, the scaled one rescores exactly those under p^(1/T)."""
  partitioner, params, batches = setup
  inputs = [b["encoder_input_tokens"] for b in batches]
  plain = predictive_eval.Predictive("posterior_mean")
  records = decoder(params, inputs, partitioner, plain, method="beam", beam_size=2)()
  scaled = decoder(params, inputs, partitioner, plain.temperature_scaled(1.7), method="beam",
                   beam_size=2)(RescoreOutputs([r.output_ids for r in records]))
  assert [r.output_ids for r in scaled] == [r.output_ids for r in records]
  unboxed = nn.unbox(params)
  row = next(i for i, r in enumerate(records) if r.output_ids)
  targets = np.zeros((1, LENGTH), np.int32)
  ids = list(records[row].output_ids) + [EOS]
  targets[0, :len(ids)] = ids
  batch = {"encoder_input_tokens": inputs[0][row:row + 1], "decoder_target_tokens": targets,
           "decoder_input_tokens": np.pad(targets[:, :-1], [(0, 0), (1, 0)]),
           "decoder_loss_weights": (targets > 0).astype(np.float32)}
  log_prob, _ = jax.jit(functools.partial(MODEL.score_batch, calibration_temperature=1.7))(
      unboxed, batch)
  np.testing.assert_allclose(scaled[row].log_prob, float(log_prob[0]), rtol=1e-5)
  assert scaled[row].log_prob != pytest.approx(records[row].log_prob)


def test_options_a_decoding_method_does_not_read_share_its_compiled_programs(setup):
  """A greedy decode given a beam size (the split's, as eval passes its options) and one
  without (the OOD sets') run the same programs, compiled once, and decode alike; a beam
  search of another size builds its own."""
  partitioner, params, batches = setup
  inputs = [batches[0]["encoder_input_tokens"]]
  decode = lambda **options: decoder(params, inputs, partitioner,
                                    predictive_eval.Predictive("posterior_mean"), **options)()
  decoding.programs.cache_clear()
  given_beam = decode(method="greedy", beam_size=4, alpha=0.6)
  assert decoding.programs.cache_info().misses == 1
  assert decode(method="greedy") == given_beam
  assert decoding.programs.cache_info()[:2] == (1, 1)  # (hits, misses)
  decode(method="beam", beam_size=2)
  decode(method="beam", beam_size=3)
  assert decoding.programs.cache_info().misses == 3


def independent_beam_measures(params, inputs, key, beam_size, num_samples=2):
  """The beam measures of ``inputs``' beams, each hypothesis scored alone by
  ``score_batch`` (an empty slot of the beam or a repeat left out); ``num_samples=0``:
  the posterior mean's, as one sample."""
  unboxed = nn.unbox(params)
  samples = {"num_samples": num_samples} if num_samples else {}
  _, aux = jax.jit(functools.partial(MODEL.predict_batch_with_aux, method="beam",
                                     beam_size=beam_size, max_length=LENGTH, **samples))(
      unboxed, {"encoder_input_tokens": inputs}, key)
  sequences = np.asarray(aux["all_sequences"])
  score = jax.jit(functools.partial(MODEL.score_batch, **samples))
  sample_log_probs = np.full((max(num_samples, 1), len(inputs), beam_size), -np.inf,
                             np.float32)
  lengths = np.ones((len(inputs), beam_size), np.int32)
  for row in range(len(inputs)):
    seen = set()
    for b in range(beam_size):
      output = decoding.until_eos(sequences[row, b], EOS)
      if not sequences[row, b].any() or tuple(output) in seen:
        continue
      seen.add(tuple(output))
      ids = (output + [EOS])[:LENGTH]
      targets = np.zeros((1, LENGTH), np.int32)
      targets[0, :len(ids)] = ids
      lengths[row, b] = len(ids)
      batch = {"encoder_input_tokens": inputs[row:row + 1], "decoder_target_tokens": targets,
               "decoder_input_tokens": np.pad(targets[:, :-1], [(0, 0), (1, 0)]),
               "decoder_loss_weights": (targets > 0).astype(np.float32)}
      log_prob, aux = score(unboxed, batch, key)
      sample_log_probs[:, row, b] = (np.asarray(aux["sample_log_probs"])[:, 0] if num_samples
                                     else np.asarray(log_prob)[0])
  return predictive.beam_sequence_measures(sample_log_probs, lengths)


@pytest.mark.slow  # beam searches of a model average (half a minute)
def test_beam_measures_score_every_hypothesis_of_the_beam(setup):
  """With the option, each record has the beam measures of its beam's hypotheses scored
  under the same weight samples; every other figure is as without it; with one beam,
  they are the one-hypothesis measures."""
  partitioner, params, batches = setup
  inputs = [batches[0]["encoder_input_tokens"]]
  decode = lambda *passes, **options: decoder(
      params, inputs, partitioner, predictive_eval.Predictive("model_average", 2), **{"method": "beam", **options})(*passes)
  plain, records = decode(beam_size=3), decode(BeamMeasures(), beam_size=3)
  assert [dataclasses.replace(r, measures={k: v for k, v in r.measures.items()
                                           if not k.startswith("beam_")}) for r in records
          ] == plain
  assert all(set(r.measures) - set(p.measures) == set(predictive.BEAM_MEASURES)
             for r, p in zip(records, plain))
  expected = independent_beam_measures(params, inputs[0], jax.random.fold_in(
      jax.random.key(1), 0), beam_size=3)  # the first batch's key
  for name in predictive.BEAM_MEASURES:
    np.testing.assert_allclose([r.measures[name] for r in records], expected[name],
                               rtol=1e-4, atol=1e-6, err_msg=name)
  assert any(abs(r.measures["beam_total_uncertainty"] - r.measures["sequence_total_uncertainty"])
             > 1e-3 for r in records)  # the other hypotheses count
  for record in decode(BeamMeasures(), beam_size=1):
    for name in ("total_uncertainty", "data_uncertainty", "reverse_mutual_information"):
      np.testing.assert_allclose(record.measures[f"beam_{name}"],
                                 record.measures[f"sequence_{name}"], rtol=1e-6, err_msg=name)
  with pytest.raises(ValueError, match="beam_measures=True needs method='beam', not 'greedy'"):
    decode(BeamMeasures(), method="greedy")


def test_one_models_beam_total_uncertainty_weighs_its_whole_beam(setup):
  """The posterior mean's beam measures: ``beam_total_uncertainty`` alone, its beam's
  hypotheses scored alone and importance-weighted; with one beam, the output's own
  ``sequence_total_uncertainty``; every other figure as without the option."""
  partitioner, params, batches = setup
  inputs = [batches[0]["encoder_input_tokens"]]
  decode = lambda *passes, **options: decoder(
      params, inputs, partitioner, predictive_eval.Predictive("posterior_mean"), **{"method": "beam", **options})(*passes)
  plain, records = decode(beam_size=3), decode(BeamMeasures(), beam_size=3)
  assert [dataclasses.replace(r, measures={k: v for k, v in r.measures.items()
                                           if k != "beam_total_uncertainty"}) for r in records
          ] == plain
  expected = independent_beam_measures(params, inputs[0], jax.random.fold_in(
      jax.random.key(1), 0), beam_size=3, num_samples=0)["beam_total_uncertainty"]
  np.testing.assert_allclose([r.measures["beam_total_uncertainty"] for r in records], expected,
                             rtol=1e-4, atol=1e-6)
  assert any(abs(r.measures["beam_total_uncertainty"] - r.measures["sequence_total_uncertainty"])
             > 1e-3 for r in records)
  for record in decode(BeamMeasures(), beam_size=1):
    assert record.measures["beam_total_uncertainty"] == pytest.approx(
        record.measures["sequence_total_uncertainty"], rel=1e-6)


def test_the_beam_measures_option_is_checked():
  from meshbayes.evaluation.settings import PredictiveConfig
  assert not PredictiveConfig().beam_measures
  with pytest.raises(ValueError, match="PredictiveConfig: beam_measures=1 must be True or False"):
    PredictiveConfig(beam_measures=1)


def test_ood_beam_sets_are_among_the_sets():
  from meshbayes.evaluation.settings import OodConfig
  settings = OodConfig(files={"spanish": "spa.txt"}, shuffled_words=True, beam_sets=["spanish"])
  assert settings.beam_sets == ("spanish",) and OodConfig().beam_sets == ()
  for bad in (["german"], "spanish"):
    with pytest.raises(ValueError, match=re.escape(
        f"OodConfig: beam_sets={bad!r} must be a list of the sets ['spanish', 'shuffled_words']")):
      OodConfig(files={"spanish": "spa.txt"}, shuffled_words=True, beam_sets=bad)


def independent_sample_log_probs(params, inputs, samples, key, num_samples, temperature=1.0):
  """``(rows, K)`` log-probabilities of each row's samples, each scored alone by
  ``score_batch`` with ``key``."""
  score = jax.jit(functools.partial(MODEL.score_batch, num_samples=num_samples,
                                    calibration_temperature=temperature))
  result = np.zeros((len(samples), len(samples[0])))
  for row, drawn in enumerate(samples):
    for k, output in enumerate(drawn):
      ids = (list(output) + [EOS])[:LENGTH]
      targets = np.zeros((1, LENGTH), np.int32)
      targets[0, :len(ids)] = ids
      batch = {"encoder_input_tokens": inputs[row:row + 1], "decoder_target_tokens": targets,
               "decoder_input_tokens": np.pad(targets[:, :-1], [(0, 0), (1, 0)]),
               "decoder_loss_weights": (targets > 0).astype(np.float32)}
      result[row, k] = float(score(nn.unbox(params), batch, key)[0][0])
  return result


@pytest.mark.parametrize("num_samples", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_equivalence_samples_are_ancestral_draws_scored_like_the_output(setup, num_samples):
  """With K, each record has K ancestral samples of its input (the model's own sampler,
  a key apart from the decode's) whose log-probabilities are score_batch's under the
  decode's key; a temperature-scaled predictive rescores the same samples at its
  temperature; without K, every record is as before, byte for byte."""
  partitioner, params, batches = setup
  inputs = [batches[0]["encoder_input_tokens"]]
  variant = predictive_eval.predictives(True, num_samples)[0]
  decode = lambda predictive, *passes: decoder(params, inputs, partitioner, predictive,
                                               method="greedy")(*passes)
  plain, records = decode(variant), decode(variant, EquivalenceSamples(3))
  assert all(r.samples == () == r.sample_log_probs for r in plain)
  assert [dataclasses.replace(r, samples=(), sample_log_probs=()) for r in records] == plain
  key = jax.random.fold_in(jax.random.key(1), 0)  # the first batch's
  _, aux = jax.jit(functools.partial(
      MODEL.predict_batch_with_aux, method="sample", num_decodes=3, temperature=1.0,
      num_samples=num_samples, max_length=LENGTH))(
          nn.unbox(params), {"encoder_input_tokens": inputs[0]},
          jax.random.fold_in(key, decode_passes.EQUIVALENCE_STREAM))
  drawn = [[tuple(decoding.until_eos(ids, EOS)) for ids in row]
           for row in np.asarray(aux["all_sequences"])]
  assert [list(r.samples) for r in records] == drawn
  assert len({s for r in records for s in r.samples}) > 8  # draws, not one mode per input
  expected = independent_sample_log_probs(params, inputs[0], drawn, key, num_samples)
  np.testing.assert_allclose([r.sample_log_probs for r in records], expected, rtol=1e-5)
  scaled = decode(variant.temperature_scaled(1.7), RescoreOutputs([r.output_ids for r in records]),
                  EquivalenceSamples(3, given=[r.samples for r in records]))
  assert [r.samples for r in scaled] == [r.samples for r in records]
  np.testing.assert_allclose([r.sample_log_probs for r in scaled], independent_sample_log_probs(
      params, inputs[0], drawn, key, num_samples, temperature=1.7), rtol=1e-5)


def test_the_equivalence_samples_option_is_checked(setup):
  from meshbayes.evaluation.settings import PredictiveConfig
  assert PredictiveConfig().equivalence_samples == 0
  assert PredictiveConfig(equivalence_samples=16).equivalence_samples == 16
  for bad in (-1, 17, 2.0, True):
    with pytest.raises(ValueError, match=f"PredictiveConfig: equivalence_samples={bad!r} "
                                         "must be an int from 0 \\(off\\) to 16"):
      PredictiveConfig(equivalence_samples=bad)
  partitioner, params, batches = setup
  decode = decoder(params, [batches[0]["encoder_input_tokens"]], partitioner,
                   predictive_eval.Predictive("posterior_mean"), method="greedy")
  for bad in (0, 17):
    with pytest.raises(ValueError, match=f"equivalence_samples={bad} must be from 1 to 16"):
      EquivalenceSamples(bad)
  with pytest.raises(ValueError, match="pass outputs too"):
    decode(EquivalenceSamples(2, given=[[(3,), (4,)]] * 8))
  with pytest.raises(ValueError, match="row 0 has 1 samples, not equivalence_samples=2"):
    decode(RescoreOutputs([(3,)] * 8), EquivalenceSamples(2, given=[[(3,)]] * 8))


def test_an_interrupted_decoding_resumes_to_the_uninterrupted_result(setup, tmp_path):
  """Batches saved as they complete (evaluation.resumable.DecodeLog); an evaluation killed
  after the first batch, started again, takes it from the file and decodes the rest: the
  same records as one uninterrupted call, for a model average with equivalence samples and
  for its temperature-scaled self rescoring them. Another fingerprint starts afresh."""
  from meshbayes.evaluation import resumable

  partitioner, params, batches = setup
  inputs = [b["encoder_input_tokens"] for b in batches]
  variant = predictive_eval.predictives(True, 2)[0]
  decode = lambda predictive, *passes: decoder(params, inputs, partitioner, predictive,
                                               method="greedy")(EquivalenceSamples(2), *passes)
  whole = decode(variant)
  fingerprint = {"step": 4, "variant": variant.name}

  class Killed(Exception):
    pass

  def killed_after_first(index, records):
    log.save(index, records)
    if index == 0:
      raise Killed

  log = resumable.DecodeLog(tmp_path, variant.name, fingerprint)
  with pytest.raises(Killed):
    decode(variant, Resumable(on_batch=killed_after_first))
  with log.path.open("a") as file:  # a line cut short by the kill
    file.write('{"batch": 1, "records": [{"output_')
  log = resumable.DecodeLog(tmp_path, variant.name, fingerprint)
  assert len(log.done) == 1 and log.done[0] == whole[:8]
  assert decode(variant, Resumable(log.done, log.save)) == whole
  assert len(resumable.DecodeLog(tmp_path, variant.name, fingerprint).done) == 2
  assert resumable.DecodeLog(tmp_path, variant.name, {**fingerprint, "step": 6}).done == []
  # A rescoring predictive skips the saved batches' rows of the outputs it is given.
  scaled = lambda *passes: decoder(params, inputs, partitioner, variant.temperature_scaled(1.7),
                                   method="greedy")(
      RescoreOutputs([r.output_ids for r in whole]),
      EquivalenceSamples(2, given=[r.samples for r in whole]), *passes)
  rescored = scaled()
  assert scaled(Resumable([rescored[:8]])) == rescored
  resumable.remove(tmp_path)
  assert not (tmp_path / "partial").exists()
