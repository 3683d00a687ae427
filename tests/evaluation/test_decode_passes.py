"""The decode passes (``evaluation.decode_passes``): built from the settings, priced for the
evaluation's plan as the plan priced them before, each adding only its own fields."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from meshbayes.evaluation import decode_passes, decoding, driver, ood
from meshbayes.evaluation.decode_passes import (BeamMeasures, EquivalenceSamples,
                                                RescoreOutputs, Resumable, SampleAgreement)
from meshbayes.evaluation.predictives import Predictive
from meshbayes.evaluation.settings import DecodeConfig, OodConfig, PredictiveConfig
from meshbayes.models.encoder_decoder import EncoderDecoderModel
from meshbayes.models.transformer import TransformerConfig
from meshbayes.partitioning import Partitioner
from tests.models.synthetic import EOS, make_batch

AVERAGE, MEAN = Predictive("model_average", 2), Predictive("posterior_mean")
# Every pass on: beam measures, equivalence samples, sample agreement, temperature scaling.
ALL_ON = (DecodeConfig(beam_size=3, sample_agreement=True),
          PredictiveConfig(num_samples=2, equivalence_samples=2, temperature_scaling=True,
                           beam_measures=True),
          OodConfig(shuffled_words=True, max_examples=16, beam_sets=["shuffled_words"]))


def test_the_settings_build_their_passes_in_the_order_they_add_measures():
  decoding_settings, predictive_settings, _ = ALL_ON
  assert decode_passes.from_settings(decoding_settings, predictive_settings) == (
      EquivalenceSamples(2), BeamMeasures(), SampleAgreement())
  assert decode_passes.from_settings(DecodeConfig(), PredictiveConfig()) == ()
  assert decode_passes.from_settings(DecodeConfig(method="greedy"), PredictiveConfig(
      equivalence_samples=16)) == (EquivalenceSamples(16),)


def test_each_pass_costs_the_plan_what_it_counted_before():
  """Forward passes per batch of each pass (times the predictive's weight samples), and
  the plan of an evaluation with every pass on, phase by phase: the numbers the plan
  counted when the passes were flags (commit 0b5d03e's ``_plan``, run on these settings)."""
  assert decode_passes.plan_cost((), AVERAGE, 3) == ("decode", 2 * 3)
  assert SampleAgreement().units(AVERAGE, 3) == 3 * 2 and SampleAgreement().units(MEAN, 3) == 0
  assert EquivalenceSamples(5).units(MEAN, 3) == 5
  assert BeamMeasures().units(AVERAGE, 3) == 0 and Resumable().units(AVERAGE, 3) == 0
  assert decode_passes.plan_cost((RescoreOutputs([]), SampleAgreement()), AVERAGE, 3) == (
      "score", 2 * (1 + 2))
  data = types.SimpleNamespace(task="t", batch_size=8)
  decoding_settings, predictive_settings, ood_settings = ALL_ON
  plan = driver._plan(data, "validation", [AVERAGE, MEAN], True, driver._Settings(  # pylint: disable=protected-access
      decoding_settings, predictive_settings, ood_settings, None))
  assert [(p.name, p.kind, p.passes, p.batches) for p in plan] == [
      ("reading t/validation", "read", 1.0, None),
      ("teacher-forced pass", "score", 3, None),
      ("fitting the temperature of model_average on validation", "score", 2, None),
      ("fitting the temperature of posterior_mean on validation", "score", 1, None),
      ("token calibration (model_average)", "score", 2, None),
      ("token calibration (posterior_mean)", "score", 1, None),
      ("token calibration (model_average_temperature_scaled)", "score", 2, None),
      ("token calibration (posterior_mean_temperature_scaled)", "score", 1, None),
      ("decoding t sources (model_average)", "decode", 22, None),
      ("decoding t sources (posterior_mean)", "decode", 5, None),
      ("scoring t sources (model_average_temperature_scaled)", "score", 10, None),
      ("scoring t sources (posterior_mean_temperature_scaled)", "score", 3, None),
      ("decoding t (greedy)", "decode", 2, 2),
      ("decoding shuffled_words (greedy)", "decode", 2, 2),
      ("decoding shuffled_words (beam)", "decode", 6, 2)]
  assert ood.BEAM_SET_PASSES == (BeamMeasures(),)


@pytest.fixture(scope="module")
def tiny():
  """A one-layer model, two batches of 8 inputs (one row each per device), its context."""
  config = TransformerConfig(vocab_size=16, emb_dim=8, num_heads=1, head_dim=8,
                             num_encoder_layers=1, num_decoder_layers=1, mlp_dim=8,
                             dropout_rate=0.0)
  model = EncoderDecoderModel(config, num_train_units=1000)
  batches = [make_batch(np.random.default_rng(i), 8, 5, 16) for i in range(2)]
  partitioner = Partitioner(data=8, model=1)
  shapes = {k: v.shape for k, v in batches[0].items()}
  params, _ = partitioner.init(lambda k: model.get_initial_variables(k, shapes)["params"],
                               jax.random.key(0))
  return (lambda predictive: decoding.DecodeContext(
      model, params, partitioner, predictive, jax.random.key(1), 5, EOS,
      {"method": "greedy"})), [b["encoder_input_tokens"] for b in batches]


def test_a_resumed_batch_is_taken_as_it_is_and_the_others_are_handed_on(tiny):
  """A batch ``Resumable`` gives is not decoded (its records stand); the others are handed
  to ``on_batch`` as they complete; a pass that does not apply is one line."""
  context, inputs = tiny
  plain = decoding.decode_and_score(context(MEAN), inputs)
  assert len(plain) == 16
  marker = dataclasses.replace(plain[0], output_ids=(99,))
  completed = []
  resumed = decoding.decode_and_score(context(MEAN), inputs, [Resumable(
      [[marker] * 8], lambda index, records: completed.append((index, records)))])
  assert resumed == [marker] * 8 + plain[8:]
  assert completed == [(1, plain[8:])]
  with pytest.raises(ValueError, match="needs method='beam', not 'greedy'"):
    decoding.decode_and_score(context(MEAN), inputs, [BeamMeasures()])


@pytest.mark.slow  # decodes with each weight sample alone (compiles a program more)
def test_sample_agreement_adds_only_its_own_measure(tiny):
  context, inputs = tiny
  plain = decoding.decode_and_score(context(AVERAGE), inputs)
  agreed = decoding.decode_and_score(context(AVERAGE), inputs, [SampleAgreement()])
  assert all(set(a.measures) - set(p.measures) == {"bleu_disagreement"} for a, p in
             zip(agreed, plain))
  assert [dataclasses.replace(a, measures={k: v for k, v in a.measures.items()
                                           if k != "bleu_disagreement"}) for a in agreed] == plain
  assert all(0 <= a.measures["bleu_disagreement"] <= 100 for a in agreed)
