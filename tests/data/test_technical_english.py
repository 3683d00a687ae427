"""The technical-English OOD set: prose sentences of scikit-learn's docstrings."""

import pathlib

import sklearn

from meshbayes.data import technical_english

SOURCE = '''
"""Tools for ridge regression. This module fits linear models with a squared penalty."""

def fit(X, y):
  """Fit the ridge model to the training data.

  Uses ``np.linalg.solve`` when X is dense. Short one.

  Parameters
  ----------
  X : array of shape (n_samples, n_features)
      The training data, with one sample in each row of the matrix.
  """
'''


def test_prose_sentences_before_the_first_section_only():
  assert technical_english.docstring_sentences(SOURCE) == [
      "This module fits linear models with a squared penalty.",
      "Fit the ridge model to the training data."]
  # Code (backticks), digits, fewer than 5 words and the Parameters section are left out;
  # "Tools for ridge regression." has 4 words.
  assert technical_english.docstring_sentences("x = (") == []   # not Python: nothing


def test_scikit_learn_sentences_are_many_distinct_and_in_a_fixed_order(tmp_path):
  sentences = technical_english.package_sentences(pathlib.Path(sklearn.__file__).parent)
  assert len(sentences) == len(set(sentences)) > 1500
  assert all(5 <= len(s.split()) <= 20 and "_" not in s for s in sentences)
  assert technical_english.prepare(tmp_path) == len(sentences)
  written = technical_english.path(tmp_path).read_text().splitlines()
  assert written == sentences
  technical_english.path(tmp_path).write_text("kept\n")
  assert technical_english.prepare(tmp_path) == 1      # already there: not rewritten
  assert technical_english.prepare(tmp_path, force=True) == len(sentences)
