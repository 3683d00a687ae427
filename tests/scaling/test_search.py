"""The search for the largest fitting model, against a stand-in for the compiler."""

import pytest

from meshbayes.scaling import search
from meshbayes.scaling.aot import StepSpec
from meshbayes.scaling.targets import parse_target

TARGET = parse_target("v2:16x16")
FAMILY = search.Family(StepSpec(model="paper"), step=256)


def fake_compile(widest: int):
  """Needs bytes growing like width squared, squeezed into memory near the limit (as the
  TPU compiler does) up to ``widest`` units."""
  def compile_fn(spec, target):
    units = dict(spec.overrides)["emb_dim"] // FAMILY.step
    if units <= widest:
      needed = min(0.8, 0.9 * (units / widest) ** 2) * target.usable_hbm_bytes
      return {"fits": True, "peak_bytes_per_device": needed, "error": None}
    return {"fits": False, "error": None,
            "required_bytes_per_device": target.usable_hbm_bytes * (units / widest) ** 2}
  return compile_fn


def test_the_family_keeps_the_presets_proportions():
  config = FAMILY.spec(8, 12).config()
  assert (config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim) == (
      2048, 256, 128, 131072)
  assert config.num_encoder_layers == config.num_decoder_layers == 12


@pytest.mark.parametrize("start", [None, 3, 60])
def test_the_search_brackets_the_widest_fit(start):
  best, records = search.largest_fit(FAMILY, TARGET, 6, fake_compile(22), start_units=start,
                                     log=lambda line: None, max_compiles=8)
  assert best["search_units"] == 22 and best["bracketed"]
  assert len(records) <= 8


def test_a_step_that_splits_heads_is_refused():
  with pytest.raises(ValueError, match="whole number of heads"):
    search.Family(StepSpec(model="paper"), step=100)


def test_a_search_goes_on_from_an_earlier_bracket():
  best, records = search.largest_fit(FAMILY, TARGET, 6, fake_compile(22), bracket=(18, 30),
                                     log=lambda line: None)
  assert best["search_units"] == 22 and best["bracketed"]
  assert 18 not in {r["search_units"] for r in records}


def test_the_search_plot_draws_memory_against_size(tmp_path):
  from meshbayes.scaling import report
  base = {"target": "v2:16x16", "generation": "v2", "usable_hbm_bytes": 7 << 30,
          "num_encoder_layers": 6, "num_decoder_layers": 6}
  records = [dict(base, variational_params=n * 1e9, fits=fits,
                  **({"peak_bytes_per_device": b << 30} if fits else
                     {"required_bytes_per_device": b << 30}))
             for n, b, fits in ((100, 6, True), (120, 9, False))]
  path = report.plot_search(records, tmp_path / "search.png")
  assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"
  assert report.plot_search([dict(base, variational_params=1e9, fits=None)],
                            tmp_path / "none.png") is None
