"""BLEU on detokenized text through sacrebleu, with one or several references per output.

Offline: sacrebleu downloads only test sets, which these wrappers never ask for. Corpus
BLEU uses sacrebleu's defaults (report it with its signature), sentence BLEU its
``sentence_bleu`` settings, 0 to 100. ``bleu_statistics`` gives each output's sufficient
statistics, so a resample's corpus BLEU is ``bleu_from_statistics`` of their sum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU

References = Sequence[str] | Sequence[Sequence[str]]


@dataclasses.dataclass(frozen=True)
class BleuResult:
  """Corpus BLEU with what is needed to report it.

  Attributes:
    score: BLEU, 0 to 100.
    signature: sacrebleu's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|...``
      (``nrefs:var`` for a varying number of references).
    precisions: the n-gram precisions (percent), n = 1 to 4.
    brevity_penalty: the brevity penalty, at most 1.
    hypothesis_length: total tokens in the predictions.
    reference_length: total tokens of the references that the brevity penalty uses.
  """
  score: float
  signature: str
  precisions: tuple[float, ...]
  brevity_penalty: float
  hypothesis_length: int
  reference_length: int


def reference_lists(references: References) -> list[list[str]]:
  """Each output's references as a list (a string is one reference).

  >>> reference_lists(['a b', ['c', 'd e']])
  [['a b'], ['c', 'd e']]
  """
  lists = [[refs] if isinstance(refs, str) else list(refs) for refs in references]
  for index, refs in enumerate(lists):
    if not refs or not all(isinstance(r, str) for r in refs):
      raise ValueError(f"references[{index}]={refs!r}: each output needs one or more "
                       "reference strings")
  return lists


def _streams(predictions: Sequence[str], references: References) -> list[list[str | None]]:
  """sacrebleu's reference streams: stream ``k`` holds each output's ``k``-th reference,
  ``None`` where an output has fewer."""
  lists = reference_lists(references)
  if len(predictions) != len(lists):
    raise ValueError(f"{len(predictions)} predictions but {len(lists)} references")
  width = max((len(refs) for refs in lists), default=1)
  return [[refs[k] if k < len(refs) else None for refs in lists] for k in range(width)]


def corpus_bleu(predictions: Sequence[str], references: References,
                tokenize: str = "13a") -> BleuResult:
  """Corpus BLEU of detokenized predictions against their references.

  Args:
    predictions: the system outputs.
    references: per output, its reference or a sequence of its references.
    tokenize: sacrebleu tokenizer name (``13a``, ``intl``, ``zh``, ``none``...).

  Returns:
    A ``BleuResult``.

  >>> result = corpus_bleu(['the cat sat on the mat'], [['a cat sat', 'the cat sat on the mat']])
  >>> round(result.score, 6), result.signature.startswith('nrefs:2|')
  (100.0, True)
  """
  metric = BLEU(tokenize=tokenize)
  score = metric.corpus_score(list(predictions), _streams(predictions, references))
  return BleuResult(
      score=float(score.score),
      signature=str(metric.get_signature()),  # known only after scoring (it counts references)
      precisions=tuple(float(p) for p in score.precisions),
      brevity_penalty=float(score.bp),
      hypothesis_length=int(score.sys_len),
      reference_length=int(score.ref_len))


def bleu_statistics(predictions: Sequence[str], references: References,
                    tokenize: str = "13a") -> np.ndarray:
  """Each output's corpus-BLEU sufficient statistics: ``(n, 10)`` = hypothesis length,
  reference length, the matched and the total n-grams for n = 1 to 4."""
  metric = BLEU(tokenize=tokenize)
  # sacrebleu's own per-segment statistics (what its significance tests resample).
  return np.asarray(metric._extract_corpus_statistics(  # pylint: disable=protected-access
      list(predictions), _streams(predictions, references)), np.int64).reshape(
          len(predictions), 2 + 2 * metric.max_ngram_order)


def bleu_from_statistics(statistics: np.ndarray) -> float:
  """Corpus BLEU (``13a`` defaults) from summed ``bleu_statistics`` rows.

  >>> stats = bleu_statistics(['a b c d', 'x y z w'], ['a b c d', 'x y z q'])
  >>> round(bleu_from_statistics(stats.sum(0)), 4) == round(corpus_bleu(
  ...     ['a b c d', 'x y z w'], ['a b c d', 'x y z q']).score, 4)
  True
  """
  return float(BLEU()._compute_score_from_stats(  # pylint: disable=protected-access
      [int(x) for x in np.asarray(statistics).ravel()]).score)


def _sentence_metric(tokenize: str) -> BLEU:
  # The settings of sacrebleu.sentence_bleu.
  return BLEU(tokenize=tokenize, smooth_method="exp", effective_order=True)


def sentence_bleu(prediction: str, reference: str | Sequence[str], tokenize: str = "13a") -> float:
  """Sentence BLEU (sacrebleu's ``sentence_bleu``: exp smoothing, effective order), 0 to 100,
  against one reference or several.

  >>> round(sentence_bleu('the cat sat on the mat', 'the cat sat on the mat'), 6)
  100.0
  """
  return float(sentence_bleus([prediction], [reference], tokenize)[0])


def sentence_bleus(predictions: Sequence[str], references: References,
                   tokenize: str = "13a") -> np.ndarray:
  """``sentence_bleu`` of each output against its references, reusing one metric object.

  Returns:
    ``(n,)`` float64 scores, 0 to 100 (clipped: sacrebleu can exceed 100 by a rounding
    error).

  >>> sentence_bleus(['a b c d', 'x y'], ['a b c d', ['p q', 'x y']])
  array([100., 100.])
  """
  lists = reference_lists(references)
  if len(predictions) != len(lists):
    raise ValueError(f"{len(predictions)} predictions but {len(lists)} references")
  metric = _sentence_metric(tokenize)
  return np.clip(np.array([metric.sentence_score(p, refs).score
                           for p, refs in zip(predictions, lists)], np.float64), 0.0, 100.0)


def bleu(targets: Sequence[str], predictions: Sequence[str],
         tokenize: str = "13a") -> dict[str, float]:
  """seqio-style metric function: ``{'bleu': corpus BLEU}``.

  Unlike T5's ``t5.evaluation.metrics.bleu`` (``intl`` tokenization), the
  default is sacrebleu's ``13a``.

  >>> bleu(['the cat sat on the mat'], ['the cat sat on the mat'])
  {'bleu': 100.0...}
  """
  return {"bleu": corpus_bleu(predictions, targets, tokenize=tokenize).score}
