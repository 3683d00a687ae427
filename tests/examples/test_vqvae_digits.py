"""The vqvae_digits example at toy size: it runs, writes its figure and JSON, and learns.

Full-size numbers (the command's defaults) are in the JSON the command writes.
"""

import json

import numpy as np
import pytest

from meshbayes.examples import vqvae_digits

pytestmark = pytest.mark.integration

TOY = ["--steps", "200", "--hidden", "16", "--num_embeddings", "16", "--embedding_dim", "8"]


# The codebook's loss-trained path (--no-ema): the layer's tests in make test, the example slow.
@pytest.mark.parametrize("ema", ["--ema", pytest.param("--no-ema", marks=pytest.mark.slow)])
def test_vqvae_reconstructs_digits_through_its_codes(tmp_path, ema):
  results = vqvae_digits.main(["--output_dir", str(tmp_path), ema, *TOY])
  assert (tmp_path / "vqvae_digits.png").stat().st_size > 10_000
  saved = json.loads((tmp_path / "vqvae_digits.json").read_text())
  assert saved["test_mse"] == pytest.approx(results["test_mse"])
  assert saved["config"]["ema"] == (ema == "--ema")
  # The mean image scores 0.074 on the test digits; 200 steps through 16 codes of 16 entries
  # already reach about a third of it (0.0233 with EMA, 0.0238 without, measured).
  assert results["test_mse_train_mean_image"] == pytest.approx(0.0740, abs=1e-3)
  assert results["test_mse"] < 0.5 * results["test_mse_train_mean_image"]
  counts = np.asarray(results["code_counts"])
  assert counts.sum() == 360 * 16 and results["codes_per_image"] == 16
  assert results["codebook_entries_used"] == int((counts > 0).sum())
  # More than one entry carries information, and the perplexity is at most the entries used.
  assert 2 < results["perplexity"] <= results["codebook_entries_used"] + 1e-4
