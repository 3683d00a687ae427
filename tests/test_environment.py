"""The test environment the rest of the suite relies on."""

import jax


def test_eight_simulated_cpu_devices():
  assert jax.device_count() == 8
  assert {d.platform for d in jax.devices()} == {"cpu"}
