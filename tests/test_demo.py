"""The demo behind `make demo` trains: the ELBO and the KL fall, accuracy rises."""

import pytest

from meshbayes import demo


def test_demo_loss_and_kl_fall(capsys):
  rows = demo.run(demo.DemoConfig(steps=300, log_every=100, num_samples=4))
  first, last = rows[0], rows[-1]
  assert last["loss"] < 0.6 * first["loss"]
  assert last["kl"] < first["kl"]
  assert last["accuracy"] > 0.5  # 4 classes: chance is 0.25
  out = capsys.readouterr().out
  assert "kl (nats)" in out and "mutual information" in out


def test_demo_config_validation():
  with pytest.raises(ValueError, match="batch_size=512 must be <= num_train=256"):
    demo.DemoConfig(batch_size=512, num_train=256)
  with pytest.raises(ValueError, match="steps=0 must be a positive int"):
    demo.DemoConfig(steps=0)
