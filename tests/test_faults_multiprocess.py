"""A process of a two-process run dies: the other stops, a restart resumes.

Two processes on localhost (jax.distributed, CPU gloo, 2 fake devices
each; the launch of tests/test_multiprocess.py) train the quickstart smoke
model with a checkpoint every 10 steps. At step 60 one of them is killed
with SIGKILL. With DDLM_JAX_HEARTBEAT_TIMEOUT_S=10 the survivor must stop
within that timeout plus a margin, with the run's one line naming the lost
process (the worker, or process 0, the coordinator) and nothing of JAX's
native abort report, exit code 134 (or SIGABRT, which a shell also reports
as 134), and a restart of both must resume from the newest complete
checkpoint (a save cut short leaves only an orbax temporary directory,
never a step).
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
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
  '--config.train.checkpoint_every=10',
  '--config.train.log_every=10',
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
    while 'step 60/' not in _read(logs[0]):
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
  assert newest >= 40  # The save at step 60 may have been cut short.
  # Both again, same command: they resume from the newest complete step.
  procs, logs = _start(
    workdir, tmp_path, 'again', '--config.train.halt_after_steps=4'
  )
  try:
    for p in procs:
      p.wait(timeout=400)
  finally:
    _kill_all(procs)
  out = _read(logs[0])
  assert [p.returncode for p in procs] == [0, 0], out[-3000:]
  assert f'resumed from step {newest} ' in out
  assert _steps(workdir)[-1] == newest + 4
