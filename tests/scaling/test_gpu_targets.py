"""GPU targets (``h100:N``, ``h200:N``): names, usable memory, compiler options, and a
simulated compile judged against a GPU's memory. Compiles for the GPUs themselves are in
test_gpu_aot.py (JAX's CUDA plugin needed)."""

import pytest

from meshbayes.scaling import aot, targets
from meshbayes.scaling.targets import GIB, parse_target


def test_gpu_names_give_gpu_targets_with_their_usable_memory():
  h200, h100 = parse_target("h200:1"), parse_target("h100:8")
  assert (h200.platform, h200.num_devices, h200.generation) == ("gpu", 1, "h200")
  assert (h100.platform, h100.num_devices, h100.generation) == ("gpu", 8, "h100")
  # The devices' memory as they report it, times the share JAX may take (0.94).
  assert targets.gpu_memory_bytes("h200") == 150_754_820_096
  assert targets.gpu_memory_bytes("h100") == 84_929_347_584
  assert h200.usable_hbm_bytes == int(150_754_820_096 * 0.94)
  assert h100.usable_hbm_bytes / GIB == pytest.approx(74.35, abs=0.01)
  assert h200.compiler_options == {"xla_gpu_enable_triton_gemm": False}
  assert parse_target("v2:2x2").compiler_options == {}
  simulated = parse_target("h200:1", "cpu")
  assert (simulated.platform, simulated.label) == ("cpu", "h200:1 (cpu)")
  assert simulated.usable_hbm_bytes == h200.usable_hbm_bytes
  assert "xla_llvm_disable_expensive_passes" in simulated.compiler_options
  assert [t.name for t in targets.parse_targets("h100:1,v2:2x2")] == ["h100:1", "v2:2x2"]


@pytest.mark.parametrize("name,platform,message", [
    ("h200:9", None, "h200:N takes 1 to 8 GPUs"),
    ("h200:0", None, "h200:N takes 1 to 8 GPUs"),
    ("h300:1", None, "nor cpu:N"),
    ("h200:1", "tpu", "is a GPU: platform='tpu' must be gpu or cpu"),
    ("v2:2x2", "gpu", "is a TPU topology: platform='gpu' must be tpu or cpu"),
    ("h200:1", "npu", "platform='npu' must be one of"),
])
def test_bad_gpu_targets_are_refused_in_one_line(name, platform, message):
  with pytest.raises(ValueError, match=message) as error:
    parse_target(name, platform)
  assert "\n" not in str(error.value)


@pytest.mark.skipif(targets.gpu_aot_available(), reason="JAX's CUDA plugin is installed")
def test_without_the_plugin_a_gpu_target_says_what_to_install():
  with pytest.raises(ValueError, match="needs JAX's CUDA plugin.*gpu-aot"):
    parse_target("h200:1").devices()


@pytest.mark.integration
def test_a_simulated_gpu_step_is_judged_against_the_gpus_memory():
  spec = aot.StepSpec(model="tiny", deterministic=True, batch_size=8, input_length=8,
                      target_length=8, partitioning="data_only", model_parallel=1,
                      overrides=(("num_layers", 1),))
  record = aot.compile_step(spec, parse_target("h100:1", "cpu"))
  assert (record["generation"], record["fit_source"], record["fits"]) == ("h100", "estimate", True)
  assert record["usable_hbm_bytes"] == parse_target("h100:1").usable_hbm_bytes
