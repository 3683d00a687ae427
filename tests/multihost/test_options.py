"""The pieces of multi-host runs that need no second process: flags, options, input shards."""

import io
import itertools
import signal
import subprocess
import sys

import numpy as np
import pytest

from meshbayes import launch
from meshbayes.runtime import distributed
from meshbayes.training.host_input import HostInput
from meshbayes.partitioning.data import DataLayout
from tests.training.runs import train_args
from meshbayes.tools import launch_local


def test_multihost_flags_become_options_and_the_rest_is_left():
  rest, options = launch.split_distributed_flags([
      "--gin_file=a.gin", "--coordinator_address=127.0.0.1:1234", "--num_processes", "2",
      "--process_id=1", "--num_cpu_devices=4", "--gin.X=1", "--multihost"])
  assert rest == ["--gin_file=a.gin", "--gin.X=1"]
  assert options == {"coordinator_address": "127.0.0.1:1234", "num_processes": 2,
                     "process_id": 1, "num_cpu_devices": 4, "auto": True}
  assert distributed.DistributedOptions(**options).enabled
  with pytest.raises(launch.UsageError, match="--num_processes='two'"):
    launch.split_distributed_flags(["--num_processes=two"])


def test_options_are_validated_and_none_means_a_single_process():
  assert not distributed.DistributedOptions().enabled
  assert not distributed.DistributedOptions(num_cpu_devices=4).enabled
  with pytest.raises(ValueError, match="together"):
    distributed.DistributedOptions(num_processes=2)
  with pytest.raises(ValueError, match="less than"):
    distributed.DistributedOptions(coordinator_address="127.0.0.1:1", num_processes=2,
                                   process_id=2)
  with pytest.raises(ValueError, match="host:port"):
    distributed.DistributedOptions(coordinator_address="127.0.0.1", num_processes=1,
                                   process_id=0)
  assert distributed.DistributedOptions(num_processes=2, auto=True).enabled  # JAX fills the rest


@pytest.mark.integration
def test_a_bad_multihost_flag_is_one_line(capsys, tmp_path):
  with pytest.raises(SystemExit) as exit_info:
    launch.run("meshbayes.train", "train", [*train_args(tmp_path, 1), "--process_id=-1"])
  assert exit_info.value.code == 1
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      "meshbayes.train: error: distributed: process_id=-1 must be a non-negative int"), lines


def test_local_workers_use_loopback_and_their_own_device_count():
  env = launch_local.child_environment({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                                                    "--xla_dump_to=/tmp/x"})
  assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
  commands = launch_local.LocalRun(args=["--gin_file=a.gin"]).commands(port=4321)
  assert [c[c.index("--gin_file=a.gin") + 1:] for c in commands] == [
      ["--coordinator_address=127.0.0.1:4321", "--num_processes=2", f"--process_id={i}",
       "--num_cpu_devices=4"] for i in range(2)]
  assert launch_local.exit_status(-9) == 137


def test_one_host_reading_two_shards_sees_what_two_hosts_read_together():
  from meshbayes.data import TaskData

  data = TaskData(task="synthetic_reverse", feature_lengths={"inputs": 8, "targets": 8},
                  batch_size=8)
  one = HostInput(data, DataLayout(8, 8, 0, 1), input_shards=2)
  hosts = [HostInput(data, DataLayout(8, 4, i, 2), input_shards=2) for i in range(2)]
  assert list(one.shard_ids) == [0, 1] and [list(h.shard_ids) for h in hosts] == [[0], [1]]
  together = zip(*(h.train_batches(start_batch=1) for h in hosts))
  for alone, parts in itertools.islice(zip(one.train_batches(start_batch=1), together), 3):
    for name, value in alone.items():
      np.testing.assert_array_equal(value, np.concatenate([p[name] for p in parts]))
  with pytest.raises(ValueError, match="multiple of the 2 groups"):
    HostInput(data, DataLayout(8, 4, 0, 2), input_shards=1)
  with pytest.raises(ValueError, match="divide the global batch"):
    HostInput(data, DataLayout(8, 8, 0, 1), input_shards=3)


def _python(code):
  return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


@pytest.mark.integration
def test_the_status_is_the_first_failures_not_a_peers_abort():
  out = io.StringIO()
  # An error (1) and a peer aborted by the coordination service (134), both ended
  # before they are seen: the error's status, not the abort's.
  processes = [_python("import sys; sys.exit(1)"), _python("import os; os.abort()")]
  for p in processes:
    p.wait()
  assert launch_local.supervise(processes, out=out, grace_seconds=5) == 1
  # A peer still running is stopped; the status stays the failure's.
  processes = [_python("import time; time.sleep(60)"), _python("import sys; sys.exit(3)")]
  assert launch_local.supervise(processes, out=out, grace_seconds=5) == 3
  assert processes[0].returncode == -signal.SIGTERM
  assert "process 1 exited with status 3; stopping the others" in out.getvalue()
  assert launch_local.supervise([_python("pass"), _python("pass")], out=out) == 0
