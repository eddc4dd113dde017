"""WorkdirLock: one writer per workdir, stale locks taken over."""

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from ddlm_jax.training.workdir_lock import WorkdirLock, WorkdirLockedError


def test_second_acquirer_in_one_process_fails(tmp_path):
  with WorkdirLock(str(tmp_path), enabled=True) as lock:
    assert lock.held
    owner = json.loads((tmp_path / '.lock').read_text())
    assert owner['pid'] == os.getpid()
    assert owner['host'] == socket.gethostname()
    with pytest.raises(WorkdirLockedError, match=f'pid {os.getpid()}'):
      WorkdirLock(str(tmp_path), enabled=True).acquire()
  assert not (tmp_path / '.lock').exists()
  # Released: the next run gets it.
  with WorkdirLock(str(tmp_path), enabled=True) as again:
    assert again.held


def test_disabled_lock_is_a_no_op(tmp_path):
  with WorkdirLock(str(tmp_path), enabled=True):
    with WorkdirLock(str(tmp_path), enabled=False) as other:
      assert not other.held


_HOLDER = textwrap.dedent(
  """
  import sys
  from ddlm_jax.training.workdir_lock import WorkdirLock
  lock = WorkdirLock(sys.argv[1], enabled=True).acquire()
  print('locked', flush=True)
  sys.stdin.read()  # Hold until the parent closes stdin.
  """
)


def test_lock_held_by_another_process(tmp_path, caplog):
  child = subprocess.Popen(
    [sys.executable, '-c', _HOLDER, str(tmp_path)],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert child.stdout.readline().strip() == 'locked'
    with pytest.raises(WorkdirLockedError) as info:
      WorkdirLock(str(tmp_path), enabled=True).acquire()
    message = str(info.value)
    assert f'pid {child.pid}' in message
    assert socket.gethostname() in message
    assert 'different --workdir' in message
  finally:
    child.kill()  # No release: the kernel drops the flock, the file stays.
    child.wait()
  assert json.loads((tmp_path / '.lock').read_text())['pid'] == child.pid
  with caplog.at_level(logging.WARNING):
    with WorkdirLock(str(tmp_path), enabled=True):
      owner = json.loads((tmp_path / '.lock').read_text())
      assert owner['pid'] == os.getpid()
  assert f'pid {child.pid}' in caplog.text and 'stale' in caplog.text


def test_stale_lock_of_dead_pid_is_taken_over(tmp_path, caplog):
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  (tmp_path / '.lock').write_text(
    json.dumps(
      {'pid': dead.pid, 'host': socket.gethostname(), 'started': 'earlier'}
    )
  )
  with caplog.at_level(logging.WARNING):
    lock = WorkdirLock(str(tmp_path), enabled=True).acquire()
  try:
    assert lock.held
    assert json.loads((tmp_path / '.lock').read_text())['pid'] == os.getpid()
    assert f'pid {dead.pid}' in caplog.text
    assert 'no longer running' in caplog.text
  finally:
    lock.release()
