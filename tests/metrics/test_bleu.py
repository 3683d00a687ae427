"""BLEU wrappers: against sacrebleu itself and against BLEU computed from its definition."""

import collections
import math
import socket

import numpy as np
import pytest
import sacrebleu

from meshbayes import metrics

# Lower-case words without punctuation: 13a tokenization is a whitespace split.
PREDICTIONS = ["the cat sat on the mat today", "a quick brown fox jumps over the dog",
               "we went to the market in the morning"]
REFERENCES = ["the cat sat on a mat today", "the quick brown fox jumped over the lazy dog",
              "we went to the market this morning"]


def ngram_counts(words, n):
  return collections.Counter(tuple(words[k:k + n]) for k in range(len(words) - n + 1))


def ngram_statistics(predictions, references):
  correct, total, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
  for prediction, reference in zip(predictions, references):
    hyp, ref = prediction.split(), reference.split()
    hyp_len, ref_len = hyp_len + len(hyp), ref_len + len(ref)
    for n in range(1, 5):
      hyp_counts, ref_counts = ngram_counts(hyp, n), ngram_counts(ref, n)
      correct[n - 1] += sum(min(c, ref_counts[g]) for g, c in hyp_counts.items())
      total[n - 1] += sum(hyp_counts.values())
  return correct, total, hyp_len, ref_len


def brevity_penalty(hyp_len, ref_len):
  return 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)


def brute_force_corpus_bleu(predictions, references):
  correct, total, hyp_len, ref_len = ngram_statistics(predictions, references)
  assert all(correct), "the example must match every n-gram order (no smoothing)"
  log_precision = sum(math.log(c / t) for c, t in zip(correct, total)) / 4
  return 100 * brevity_penalty(hyp_len, ref_len) * math.exp(log_precision)


def brute_force_sentence_bleu(prediction, reference):
  """Exponential smoothing (the k-th order without matches gets 1 / (2^k total)) and the
  effective order (orders beyond the sentence's length are left out)."""
  correct, total, hyp_len, ref_len = ngram_statistics([prediction], [reference])
  if not any(correct):
    return 0.0
  log_precisions, zeros = [], 0
  for c, t in zip(correct, total):
    if t == 0:
      break
    if c == 0:
      zeros += 1
      log_precisions.append(math.log(1 / (2 ** zeros * t)))
    else:
      log_precisions.append(math.log(c / t))
  return 100 * brevity_penalty(hyp_len, ref_len) * math.exp(sum(log_precisions) /
                                                            len(log_precisions))


def test_corpus_bleu_of_identical_strings_is_100():
  result = metrics.corpus_bleu(REFERENCES, REFERENCES)
  assert result.score == pytest.approx(100.0)
  assert result.brevity_penalty == 1.0 and result.hypothesis_length == result.reference_length


def test_corpus_bleu_matches_definition_and_sacrebleu():
  result = metrics.corpus_bleu(PREDICTIONS, REFERENCES)
  assert result.score == pytest.approx(brute_force_corpus_bleu(PREDICTIONS, REFERENCES), rel=1e-9)
  own = sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES])
  assert result.score == own.score
  assert result.precisions == tuple(own.precisions)
  assert "nrefs:1" in result.signature and "tok:13a" in result.signature
  assert result.signature == _signature_of_default_bleu()
  assert "tok:none" in metrics.corpus_bleu(PREDICTIONS, REFERENCES, tokenize="none").signature
  assert metrics.bleu(REFERENCES, PREDICTIONS) == {"bleu": result.score}


def _signature_of_default_bleu():
  metric = sacrebleu.BLEU()
  metric.corpus_score(PREDICTIONS, [REFERENCES])
  return str(metric.get_signature())


def test_sentence_bleu_matches_definition_and_sacrebleu():
  pairs = list(zip(PREDICTIONS, REFERENCES)) + [
      ("the cat", "the cat sat"),             # shorter than 4 words: effective order 2
      ("one two three four five", "one two three five four"),  # no 4-gram match: smoothed
      ("completely different", "nothing in common"),          # no match at all: 0
  ]
  predictions, references = zip(*pairs)
  batch = metrics.sentence_bleus(predictions, references)
  assert batch.shape == (len(pairs),) and batch.dtype == np.float64
  for k, (prediction, reference) in enumerate(pairs):
    own = sacrebleu.sentence_bleu(prediction, [reference]).score
    assert metrics.sentence_bleu(prediction, reference) == own
    assert batch[k] == own
    assert batch[k] == pytest.approx(brute_force_sentence_bleu(prediction, reference), rel=1e-9)
  assert batch[-1] == 0.0 and 0 < batch[-2] < 100


def test_scoring_is_offline(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("BLEU scoring tried to open a network connection")

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  assert metrics.corpus_bleu(PREDICTIONS, REFERENCES).score > 0
  assert metrics.sentence_bleus(PREDICTIONS, REFERENCES).min() > 0


def test_length_mismatch_is_an_error():
  with pytest.raises(ValueError, match="2 predictions but 3 references"):
    metrics.corpus_bleu(PREDICTIONS[:2], REFERENCES)
  with pytest.raises(ValueError, match="predictions but"):
    metrics.sentence_bleus(PREDICTIONS, REFERENCES[:1])


def test_several_references_per_output_match_sacrebleu_and_the_definition():
  """A varying number of references per output: sacrebleu's multi-reference BLEU (its
  streams padded with None); with one reference each, the single-reference figure."""
  references = [[REFERENCES[0], "the cat sat on the mat today"], [REFERENCES[1]],
                [REFERENCES[2], "we went to market in the morning", "we went to the market"]]
  result = metrics.corpus_bleu(PREDICTIONS, references)
  streams = [[refs[k] if k < len(refs) else None for refs in references] for k in range(3)]
  assert result.score == sacrebleu.corpus_bleu(PREDICTIONS, streams).score
  assert result.score > metrics.corpus_bleu(PREDICTIONS, REFERENCES).score
  assert result.signature.startswith("nrefs:var|")
  assert metrics.corpus_bleu(PREDICTIONS, [[r] for r in REFERENCES]).score == \
      metrics.corpus_bleu(PREDICTIONS, REFERENCES).score
  for k, prediction in enumerate(PREDICTIONS):
    assert metrics.sentence_bleus(PREDICTIONS, references)[k] == pytest.approx(
        sacrebleu.sentence_bleu(prediction, references[k]).score)
  assert metrics.sentence_bleu(PREDICTIONS[0], references[0]) == 100.0  # matches its second
  with pytest.raises(ValueError, match=r"references\[1\]=\[\]: each output needs one or more"):
    metrics.corpus_bleu(PREDICTIONS[:2], [["a"], []])


def test_corpus_bleu_of_any_subset_from_summed_statistics():
  """The bootstrap's shortcut: BLEU of resampled outputs (repeats included) from their summed
  sufficient statistics equals BLEU of the resampled corpus itself."""
  references = [[r, r.replace("the", "a")] for r in REFERENCES]
  statistics = metrics.bleu_statistics(PREDICTIONS, references)
  assert statistics.shape == (3, 10)
  for index in ([0, 1, 2], [2, 2, 0], [1]):
    resampled = metrics.corpus_bleu([PREDICTIONS[i] for i in index],
                                    [references[i] for i in index]).score
    assert metrics.bleu_from_statistics(statistics[index].sum(0)) == pytest.approx(resampled,
                                                                                   rel=1e-12)
