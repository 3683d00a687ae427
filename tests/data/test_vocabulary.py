"""SentencePiece vocabularies: training, T5's special ids, round trips, the missing-file error."""

import pytest
import seqio

from meshbayes.data import paths, sentencepiece_vocab

WORDS = ("the cat sees a dog near our house while it rains and every bird sings "
         "le chat voit un chien près de notre maison pendant qu'il pleut où chaque oiseau chante")


def _sentences(n=600):
  words = WORDS.split()
  return [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(3 + i % 9)).capitalize()
          + "." for i in range(n)]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_trained_vocabulary_round_trips_text_with_t5_ids(tmp_path, model_type):
  path = sentencepiece_vocab.train(_sentences(), tmp_path / "v.model", vocab_size=90,
                                   model_type=model_type)
  vocabulary = seqio.SentencePieceVocabulary(str(path))
  tokenizer = vocabulary.tokenizer
  assert (tokenizer.pad_id(), tokenizer.eos_id(), tokenizer.unk_id(), tokenizer.bos_id()) == (
      0, 1, 2, -1)
  assert vocabulary.vocab_size == 90
  for text in _sentences()[:50] + ["Le chat près de la maison voit un oiseau."]:
    ids = vocabulary.encode(text)
    assert ids and min(ids) > 2  # no padding, EOS or UNK inside known text
    assert vocabulary.decode(ids) == text
  assert vocabulary.decode(vocabulary.encode("the cat") + [1, 0, 0]) == "the cat"


def test_training_is_deterministic(tmp_path):
  a = sentencepiece_vocab.train(_sentences(), tmp_path / "a.model", vocab_size=100)
  b = sentencepiece_vocab.train(iter(_sentences()), tmp_path / "b.model", vocab_size=100)
  assert a.read_bytes() == b.read_bytes()
  with pytest.raises(ValueError, match="model_type='word' must be 'unigram' or 'bpe'"):
    sentencepiece_vocab.train(_sentences(), tmp_path / "c.model", model_type="word")


def test_prepared_vocabulary_is_found_when_used(tmp_path, monkeypatch):
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(tmp_path / "one"))
  vocabulary = sentencepiece_vocab.PreparedVocabulary("toy", "run `make data`")
  expected = tmp_path / "one" / "vocabularies" / "toy.model"
  assert vocabulary.path == paths.vocabulary_path("toy") == expected
  with pytest.raises(ValueError, match=rf"^vocabulary {expected} not found; run `make data`$"):
    vocabulary.encode("the cat")

  sentencepiece_vocab.train(_sentences(), expected, vocab_size=100)
  assert vocabulary.decode(vocabulary.encode("the cat")) == "the cat"
  assert vocabulary.vocab_size == 100
  # Another data directory: looked up again.
  monkeypatch.setenv("MESHBAYES_DATA_DIR", str(tmp_path / "two"))
  with pytest.raises(ValueError, match="two/vocabularies/toy.model not found"):
    vocabulary.encode("the cat")
