"""A process's error line stays whole when other threads write to the same stream, and
``launch_local`` never glues one process's line onto another's."""

import subprocess
import sys
import textwrap
import threading

from meshbayes.tools import launch_local
from tests.training.runs import ROOT

# The error line is written while a thread writes C++-like log lines to the same
# descriptor, as gloo and the coordination service do when a peer leaves.
_WRITER = textwrap.dedent("""
    import os, threading
    from meshbayes.launch import write_line
    stop = threading.Event()
    def logs():
      while not stop.is_set():
        os.write(2, b"E1129 06:00:00.000000 4242 tcp.cc:91] peer closed the connection\\n")
    thread = threading.Thread(target=logs)
    thread.start()
    for i in range(%d):
      write_line(f"meshbayes.train: error: process 0/2: error {i} (traceback in x.log)")
    stop.set()
    thread.join()
""")


def test_an_error_line_is_whole_beside_a_concurrent_writer():
  count = 2000
  result = subprocess.run([sys.executable, "-u", "-c", _WRITER % count], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
  errors = [line for line in result.stderr.splitlines() if "meshbayes.train" in line]
  assert errors == [f"meshbayes.train: error: process 0/2: error {i} (traceback in x.log)"
                    for i in range(count)]


class _Process:
  """A stand-in of ``subprocess.Popen`` whose output is the given lines."""

  def __init__(self, lines):
    self.stdout = iter(lines)


class _Out:
  def __init__(self):
    self.text = ""

  def write(self, text):
    self.text += text

  def flush(self):
    pass


def test_a_last_line_without_newline_is_ended_before_the_next_process_writes():
  out, lock = _Out(), threading.Lock()
  launch_local._stream(1, _Process(["I1129 started\n", "E1129 killed mid-li"]), out, lock)
  launch_local._stream(0, _Process(["meshbayes.train: error: x\n"]), out, lock)
  assert out.text.splitlines() == ["[1] I1129 started", "[1] E1129 killed mid-li",
                                   "[0] meshbayes.train: error: x"]
