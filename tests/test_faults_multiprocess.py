"""A process of a two-process run dies: the other stops, a restart resumes.

Two processes on localhost (jax.distributed, CPU gloo, 2 fake devices
each; the launch of tests/test_multiprocess.py) train the quickstart smoke
model with a checkpoint every 20 steps. At step 70 one of them is killed
with SIGKILL. With DDLM_JAX_HEARTBEAT_TIMEOUT_S=10 the survivor must stop
within that timeout plus a margin, with the run's one line naming the lost
process (the worker, or process 0, the coordinator) and nothing of JAX's
native abort report, exit code 134 (or SIGABRT, which a shell also reports
as 134), and a restart of both must resume from the newest complete
checkpoint (a save cut short leaves only an orbax temporary directory,
never a step) and log the very losses the first run logged.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ddlm_jax.training import faults

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEARTBEAT_S = 10
MARGIN_S = 45  # Time to notice and abort, on a loaded CI machine.
ARGS = (
  '-m',
  'experiments.run',
  '--config=experiments/configs/quickstart.py:smoke',
  '--config.train.num_steps=100000',
  '--config.train.checkpoint_every=20',
  '--config.train.log_every=5',
  '--config.train.eval_every=0',
  '--config.sample.num_samples=0',
)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env(port: int, pid: int) -> dict:
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(('JAX_COORDINATOR', 'JAX_NUM_PROC', 'JAX_PROCESS_ID'))
  }
  flags = [
    f
    for f in env.get('XLA_FLAGS', '').split()
    if not f.startswith('--xla_force_host_platform_device_count')
  ]
  flags.append('--xla_force_host_platform_device_count=2')
  env.update(
    XLA_FLAGS=' '.join(flags),
    JAX_PLATFORMS='cpu',
    JAX_CPU_COLLECTIVES_IMPLEMENTATION='gloo',
    PYTHONPATH=str(ROOT),
    PYTHONUNBUFFERED='1',
    JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
    JAX_NUM_PROCESSES='2',
    JAX_PROCESS_ID=str(pid),
    DDLM_JAX_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_S),
    DDLM_JAX_SHUTDOWN_TIMEOUT_S=str(HEARTBEAT_S),
  )
  return env


def _start(workdir, log_dir, tag, *extra):
  port = _free_port()
  procs, logs = [], []
  for i in range(2):
    log = open(log_dir / f'{tag}_p{i}.log', 'w+')  # noqa: SIM115
    logs.append(log)
    procs.append(
      subprocess.Popen(
        [sys.executable, *ARGS, f'--workdir={workdir}', *extra],
        cwd=ROOT,
        env=_env(port, i),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  return procs, logs


def _read(log) -> str:
  log.seek(0)
  return log.read()


def _kill_all(procs):
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def _train_records(workdir) -> dict[int, dict]:
  with open(workdir / 'metrics.jsonl') as f:
    records = [json.loads(line) for line in f if line.strip()]
  return {r['step']: r for r in records if r['split'] == 'train'}


def _steps(workdir) -> list[int]:
  ck = workdir / 'checkpoints'
  return sorted(int(n) for n in os.listdir(ck) if n.isdigit())


@pytest.mark.slow
@pytest.mark.parametrize('victim', [1, 0], ids=['worker', 'coordinator'])
def test_a_killed_process_stops_the_other_and_both_resume(tmp_path, victim):
  workdir = tmp_path / 'run'
  procs, logs = _start(workdir, tmp_path, 'first')
  try:
    deadline = time.monotonic() + 400
    while 'step 70/' not in _read(logs[0]):
      assert all(p.poll() is None for p in procs), _read(logs[0])[-3000:]
      assert time.monotonic() < deadline, 'no progress'
      time.sleep(0.2)
    procs[victim].kill()
    killed_at = time.monotonic()
    survivor = procs[1 - victim]
    try:
      survivor.wait(timeout=HEARTBEAT_S + MARGIN_S)
    except subprocess.TimeoutExpired:
      pytest.fail(f'the survivor still runs {HEARTBEAT_S + MARGIN_S} s on')
    took = time.monotonic() - killed_at
  finally:
    _kill_all(procs)
  # The survivor's one line (printed by its stderr filter process, which
  # may end a moment after the survivor when JAX's abort came first).
  lost = f'error: lost process {victim} of 2'
  deadline = time.monotonic() + 10
  while lost not in (out := _read(logs[1 - victim])):
    assert time.monotonic() < deadline, out[-3000:]
    time.sleep(0.2)
  assert survivor.returncode in (faults.LOST_PROCESS, -signal.SIGABRT)
  assert took < HEARTBEAT_S + MARGIN_S
  tail = out[out.index('compiled and ran') :]
  assert tail.count('error:') == 1, tail[-3000:]
  assert 'start all processes again' in tail
  # No native log lines, stack traces or Python tracebacks.
  assert not re.search(r'^[IWEF]\d{4} ', tail, re.M), tail[-3000:]
  assert 'Check failure' not in tail and 'Traceback' not in tail, tail
  newest = _steps(workdir)[-1]
  assert newest in (40, 60)  # The save at step 60 may have been cut short.
  first = _train_records(workdir)  # Every 5 steps, up to 65 at least.
  # Both again, same command: they resume from the newest complete step.
  procs, logs = _start(
    workdir, tmp_path, 'again', '--config.train.halt_after_steps=5'
  )
  try:
    for p in procs:
      p.wait(timeout=400)
  finally:
    _kill_all(procs)
  out = _read(logs[0])
  assert [p.returncode for p in procs] == [0, 0], out[-3000:]
  assert f'resumed from step {newest} ' in out
  assert _steps(workdir)[-1] == newest + 5
  # The resumed steps are the first run's steps, bit for bit.
  again = _train_records(workdir)[newest + 5]
  for key in ('loss', 'nelbo_per_token'):
    assert again[key] == first[newest + 5][key], (key, again, first)


# ------------------------------------------ the pieces, without processes

# JAX's own report before its abort, as the survivor of a killed worker
# prints it (coordination service, then the client), and as a process
# prints it when process 0 and its service are gone.
_WORKER_REPORT = """\
E1204 20:36:03.010646    6538 coordination_service.cc:1549] [1814] Use error \
polling to propagate the following error to all tasks: UNAVAILABLE: The \
following tasks are unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error.
E1204 20:36:03.011061    6549 coordination_service_agent.cc:289] Polled an \
error from coordination service (this can be an error from this or another \
task).
F1204 20:36:03.011118    6549 client.h:80] Terminating process because the \
JAX distributed service detected fatal errors. This most likely indicates \
that another task died. absl::Status: UNAVAILABLE: The following tasks are \
unhealthy (stopped sending heartbeats):
1
*** Check failure stack trace: ***
    @     0x7feb42640634  absl::log_internal::LogMessage::SendToLog()
"""
_COORDINATOR_REPORT = """\
W1204 20:37:33.375048   13237 preemption_sync_manager.cc:147] Failed to \
retrieve preemption notice from coordination service: UNAVAILABLE: Socket \
closed
F1204 20:37:33.375140   13237 client.h:80] Terminating process because the \
JAX distributed service detected fatal errors. absl::Status: UNAVAILABLE: \
Failed to send RPC to coordination service. Either the leader task was \
preempted/died/restarted unexpectedly or this task is experiencing network \
issues.
*** Check failure stack trace: ***
"""


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _filtered(text, clock=None, idle_after=None):
  from ddlm_jax.parallel import stderr_guard

  filt = stderr_guard.Filter(2, **({'clock': clock} if clock else {}))
  out = ''.join(filt.feed(line) for line in text.splitlines(keepends=True))
  if idle_after is not None:
    clock.now = idle_after
    out += filt.tick()
  return out + filt.tick(final=True)


@pytest.mark.parametrize(
  'report, lost', [(_WORKER_REPORT, 1), (_COORDINATOR_REPORT, 0)]
)
def test_jax_abort_report_becomes_the_one_line(report, lost):
  before = 'step 60/100 | loss 1.47\n[Gloo] Rank 0 is connected\n'
  after = 'error: Saving checkpoint failed: TimeoutError\n'
  out = _filtered(before + report + after)
  assert out.startswith(before)
  line = out[len(before) :]
  assert line.startswith(f'error: lost process {lost} of 2')
  assert line.count('\n') == 1 and 'start all processes again' in line
  assert ('coordinator' in line) == (lost == 0)


def test_process_0_never_names_itself_lost():
  """Process 0 hosts the service; its JAX blaming the coordination service
  (a shutdown barrier a dead peer never reached) names an unknown peer."""
  from ddlm_jax.parallel import stderr_guard

  filt = stderr_guard.Filter(2, process_id=0)
  out = ''.join(filt.feed(x) for x in _COORDINATOR_REPORT.splitlines(True))
  assert out.startswith('error: lost process ? of 2:'), out
  assert 'coordinator' not in out


def test_the_runs_own_lost_line_ends_the_output():
  from ddlm_jax.parallel import stderr_guard

  ours = stderr_guard.lost_line(1, 2, 10) + '\n'
  assert 'silent for 10 s' in ours
  out = _filtered('step 1\n' + ours + _WORKER_REPORT)
  assert out == 'step 1\n' + ours


def test_coordination_lines_without_an_abort_pass_a_moment_later():
  from ddlm_jax.parallel import stderr_guard

  warn = 'W1204 20:37:33.375048   13237 preemption_sync_manager.cc:147] slow\n'
  clock = _Clock()
  filt = stderr_guard.Filter(2, clock=clock)
  assert filt.feed(warn) == '' and filt.feed('continued\n') == ''
  clock.now = stderr_guard.HOLD_S / 2
  assert filt.tick() == ''
  clock.now = stderr_guard.HOLD_S
  assert filt.tick() == warn + 'continued\n'
  assert filt.feed('step 2\n') == 'step 2\n'


def test_the_guard_script_filters_a_pipe():
  """The filter as the run starts it: a separate python, stdlib only."""
  from ddlm_jax.parallel import stderr_guard

  out = subprocess.run(
    [sys.executable, '-I', '-S', stderr_guard.__file__, '1', '2'],
    input='step 3\n' + _COORDINATOR_REPORT + 'after the abort\n',
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout == ''
  lines = out.stderr.splitlines()
  assert lines[0] == 'step 3' and len(lines) == 2, out.stderr
  assert lines[1].startswith('error: lost process 0 of 2 (the coordinator')


def test_a_peer_is_lost_only_after_the_timeout_unless_done():
  from ddlm_jax.parallel.liveness import stale

  last = {1: (None, 0.0), 2: (None, 0.0)}
  last, lost = stale(last, {1: '1', 2: '1'}, 1.0, 5.0)
  assert lost is None and last == {1: ('1', 1.0), 2: ('1', 1.0)}
  last, lost = stale(last, {1: '2', 2: '1'}, 5.5, 5.0)
  assert lost is None  # Process 2 silent for 4.5 s: not yet.
  last, lost = stale(last, {1: '3', 2: '1'}, 6.5, 5.0)
  assert lost == 2 and last[1] == ('3', 6.5)
  last, lost = stale(last, {1: 'done', 2: '2'}, 100.0, 5.0)
  last, lost = stale(last, {1: 'done', 2: '3'}, 200.0, 5.0)
  assert lost is None  # A finished process is never lost.


def test_jax_heartbeat_timeout_is_twice_the_runs():
  from ddlm_jax.parallel.mesh import LIVENESS_TIMEOUT_S, _timeouts

  assert _timeouts({}) == (
    LIVENESS_TIMEOUT_S,
    {'heartbeat_timeout_seconds': 2 * LIVENESS_TIMEOUT_S},
  )
  env = {
    'DDLM_JAX_HEARTBEAT_TIMEOUT_S': '10',
    'DDLM_JAX_SHUTDOWN_TIMEOUT_S': '30',
  }
  assert _timeouts(env) == (
    10,
    {'heartbeat_timeout_seconds': 20, 'shutdown_timeout_seconds': 30},
  )
  with pytest.raises(ValueError, match='must be >= 1'):
    _timeouts({'DDLM_JAX_HEARTBEAT_TIMEOUT_S': '0'})


class _Store:
  """jax.distributed's key-value client, in memory (the calls used)."""

  def __init__(self, broken=False):
    self.data, self.broken = {}, broken

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.broken:
      raise TypeError('key_value_set() got an unexpected keyword argument')
    assert allow_overwrite or key not in self.data
    self.data[key] = value

  def key_value_dir_get(self, prefix):
    return [(k, v) for k, v in self.data.items() if k.startswith(prefix)]


def _dog(store, monkeypatch, timeout_s=1.0):
  from ddlm_jax.parallel import liveness

  lost = []

  def lose(self, process, silent_s):
    lost.append(process)
    self.stopped.set()

  monkeypatch.setattr(liveness.Watchdog, 'lose', lose)
  return liveness.Watchdog(store, 0, 2, timeout_s), lost


def test_the_watchdog_names_a_peer_that_stops_beating(monkeypatch):
  store = _Store()
  dog, lost = _dog(store, monkeypatch)
  dog.start()
  for beat in range(8):  # Process 1 beats for 1.6 s: alive.
    store.key_value_set('ddlm_jax/alive/1', str(beat), allow_overwrite=True)
    time.sleep(0.2)
  assert lost == [] and store.data['ddlm_jax/alive/0'] != '0'
  dog.join(timeout=10)  # Then silent: lost after the 1 s timeout.
  assert lost == [1]


def test_moved_needs_a_beat_after_the_read_or_done():
  from ddlm_jax.parallel.liveness import moved

  before = {1: '5', 2: None}
  assert not moved(before, {1: '5', 2: '1'})
  assert not moved(before, {1: '4', 2: '1'})  # An older value: no beat.
  assert moved(before, {1: '6', 2: '1'})
  assert moved(before, {1: 'done', 2: '0'})
  assert not moved({1: '5'}, {})


def _settled(monkeypatch, store, beating):
  """liveness.settle() with process 1's last beat written just before it
  (the watchdog has not read it yet); `beating`: process 1 beats on."""
  from ddlm_jax.parallel import liveness

  dog, lost = _dog(store, monkeypatch)
  store.key_value_set('ddlm_jax/alive/1', '4', allow_overwrite=True)
  dog.start()
  time.sleep(0.3)  # The watchdog has read '4'.
  store.key_value_set('ddlm_jax/alive/1', '5', allow_overwrite=True)
  stop = threading.Event()

  def beat():
    n = 5
    while beating and not stop.wait(0.1):
      n += 1
      store.key_value_set('ddlm_jax/alive/1', str(n), allow_overwrite=True)

  peer = threading.Thread(target=beat, daemon=True)
  peer.start()
  monkeypatch.setattr(liveness, '_active', dog)
  t0 = time.monotonic()
  liveness.settle()
  took = time.monotonic() - t0
  stop.set()
  dog.stop()
  dog.join(timeout=10)
  return lost, took


def test_settle_waits_for_the_watchdog_when_the_peer_fell_silent(
  monkeypatch,
):
  """A peer killed mid-collective fails this process's step at once; the
  watchdog may read its last beat only after that. settle() must still
  wait until the watchdog names it, not take that beat for a live peer."""
  lost, took = _settled(monkeypatch, _Store(), beating=False)
  assert lost == [1] and took >= 1.0  # The 1 s timeout passed first.


def test_settle_returns_once_a_live_peer_beats_again(monkeypatch):
  lost, took = _settled(monkeypatch, _Store(), beating=True)
  assert lost == [] and took < 1.0


def test_a_finished_peer_is_never_lost(monkeypatch):
  store = _Store()
  dog, lost = _dog(store, monkeypatch)
  store.key_value_set('ddlm_jax/alive/1', 'done')
  dog.start()
  time.sleep(2.0)
  dog.stop()
  dog.join(timeout=10)
  assert lost == [] and store.data['ddlm_jax/alive/0'] == 'done'


def test_no_watchdog_where_the_store_refuses_the_first_beat(capsys):
  from ddlm_jax.parallel import liveness

  assert liveness.start(_Store(broken=True), 0, 2, 10) is None
  assert liveness._active is None and liveness._guard is None
  assert "JAX's own abort" in capsys.readouterr().err


def test_the_lost_task_named_on_the_line_after_the_fatal_one():
  """A process without the service sees only the client's report, whose
  task ids follow the fatal line; the filter waits for them (or for the
  stack trace, or a moment)."""
  report = _WORKER_REPORT[_WORKER_REPORT.index('E1204 20:36:03.011061') :]
  assert 'heartbeats):\n1\n*** Check' in report
  out = _filtered('step 1\n' + report)
  assert out.startswith('step 1\nerror: lost process 1 of 2:'), out
  cut = report[: report.index('1\n*** Check')]  # The ids never came.
  out = _filtered(cut, clock=_Clock(), idle_after=10.0)
  assert out.startswith('error: lost process ? of 2:'), out
