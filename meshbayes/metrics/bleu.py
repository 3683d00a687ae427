"""BLEU on detokenized text, through sacrebleu (one reference per output).

Scoring strings is offline: sacrebleu downloads only test sets, which these
wrappers never ask for. Corpus BLEU uses sacrebleu's defaults (``13a``
tokenization, exponential smoothing, mixed case); report it with its
signature. Sentence BLEU uses sacrebleu's ``sentence_bleu`` settings
(``exp`` smoothing, effective n-gram order), 0 to 100; sequence-level
calibration divides it by 100.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU


@dataclasses.dataclass(frozen=True)
class BleuResult:
  """Corpus BLEU with what is needed to report it.

  Attributes:
    score: BLEU, 0 to 100.
    signature: sacrebleu's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|...``.
    precisions: the n-gram precisions (percent), n = 1 to 4.
    brevity_penalty: the brevity penalty, at most 1.
    hypothesis_length: total tokens in the predictions.
    reference_length: total tokens in the references.
  """
  score: float
  signature: str
  precisions: tuple[float, ...]
  brevity_penalty: float
  hypothesis_length: int
  reference_length: int


def _check_lengths(predictions: Sequence[str], references: Sequence[str]) -> None:
  if len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions but {len(references)} references")


def corpus_bleu(predictions: Sequence[str], references: Sequence[str],
                tokenize: str = "13a") -> BleuResult:
  """Corpus BLEU of detokenized predictions against one reference each.

  Args:
    predictions: the system outputs.
    references: their references, aligned with ``predictions``.
    tokenize: sacrebleu tokenizer name (``13a``, ``intl``, ``zh``, ``none``...).

  Returns:
    A ``BleuResult``.

  >>> result = corpus_bleu(['the cat sat on the mat'], ['the cat sat on the mat'])
  >>> round(result.score, 6), result.signature.startswith('nrefs:1|')
  (100.0, True)
  """
  _check_lengths(predictions, references)
  metric = BLEU(tokenize=tokenize)
  score = metric.corpus_score(list(predictions), [list(references)])
  return BleuResult(
      score=float(score.score),
      signature=str(metric.get_signature()),  # known only after scoring (it counts references)
      precisions=tuple(float(p) for p in score.precisions),
      brevity_penalty=float(score.bp),
      hypothesis_length=int(score.sys_len),
      reference_length=int(score.ref_len))


def _sentence_metric(tokenize: str) -> BLEU:
  # The settings of sacrebleu.sentence_bleu.
  return BLEU(tokenize=tokenize, smooth_method="exp", effective_order=True)


def sentence_bleu(prediction: str, reference: str, tokenize: str = "13a") -> float:
  """Sentence BLEU (sacrebleu's ``sentence_bleu``: exp smoothing, effective order), 0 to 100.

  >>> round(sentence_bleu('the cat sat on the mat', 'the cat sat on the mat'), 6)
  100.0
  """
  return float(_sentence_metric(tokenize).sentence_score(prediction, [reference]).score)


def sentence_bleus(predictions: Sequence[str], references: Sequence[str],
                   tokenize: str = "13a") -> np.ndarray:
  """``sentence_bleu`` of each aligned pair, reusing one metric object.

  Returns:
    ``(n,)`` float64 scores, 0 to 100.

  >>> sentence_bleus(['a b c d', 'x y'], ['a b c d', 'p q'])
  array([100.,   0.])
  """
  _check_lengths(predictions, references)
  metric = _sentence_metric(tokenize)
  return np.array([metric.sentence_score(p, [r]).score for p, r in zip(predictions, references)],
                  np.float64)


def bleu(targets: Sequence[str], predictions: Sequence[str],
         tokenize: str = "13a") -> dict[str, float]:
  """seqio-style metric function: ``{'bleu': corpus BLEU}``.

  Unlike T5's ``t5.evaluation.metrics.bleu`` (``intl`` tokenization), the
  default is sacrebleu's ``13a``.

  >>> bleu(['the cat sat on the mat'], ['the cat sat on the mat'])
  {'bleu': 100.0...}
  """
  return {"bleu": corpus_bleu(predictions, targets, tokenize=tokenize).score}
