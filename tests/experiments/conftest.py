"""Fixtures the experiment tests share."""

import pytest

from meshbayes.data import technical_english
from tests.data import corpus


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """The fake corpus and the technical-English OOD set, prepared in a data folder (the
  trainer and the evaluation find it by ``MESHBAYES_DATA_DIR``, which the tests set)."""
  root = tmp_path_factory.mktemp("data")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("MESHBAYES_DATA_DIR", str(root / "data"))
    corpus.prepare_with_vocabulary(root / "data")
    technical_english.prepare(root / "data")
  return root / "data"
