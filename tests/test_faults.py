"""Every fault ends in a clean state and a one-line answer (docs/FAULTS.md).

The loop's faults use a tiny least-squares task (a second a run); the
language-model cases use the quickstart smoke config; the command-line
cases run `python -m experiments.run` in a subprocess and are marked slow.
"""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.data.tokenizers import CharTokenizer, load_tokenizer
from ddlm_jax.sampling.autoregressive import autoregressive_sample
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.tasks.language_model import check_prompt, load_config
from ddlm_jax.training import config as config_lib
from ddlm_jax.training import faults, fit
from ddlm_jax.training.checkpoint import (
  Checkpointer,
  CheckpointSaveError,
  NoCheckpointError,
)
from ddlm_jax.training.config import ConfigError
from ddlm_jax.training.workdir_lock import WorkdirLock
from experiments import modes
from experiments.configs import (
  ar_quickstart,
  bd3_quickstart,
  duo_quickstart,
  quickstart,
)
from experiments.configs.common import override

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM = 4


def _batches(start):
  step = start
  while True:
    rng = np.random.default_rng([0, step])
    x = rng.normal(size=(8, DIM)).astype(np.float32)
    step += 1
    yield {'x': x, 'y': x @ np.arange(1, DIM + 1, dtype=np.float32)}


def _task(**kw):
  def loss(params, key, batch):
    del key
    err = batch['x'] @ params['w'] - batch['y']
    return jnp.mean(err**2), {}

  return fit.Task(
    init=lambda key: {'w': jax.random.normal(key, (DIM,)) * 0.1},
    loss=loss,
    batches=_batches,
    **kw,
  )


def _cfg(**kw):
  fields = dict(
    num_steps=8,
    seed=0,
    log_every=2,
    eval_every=0,
    checkpoint_every=4,
    optimizer=config_lib.optimizer_config(
      learning_rate=0.05, warmup_steps=1, total_steps=8
    ),
  )
  fields.update(kw)
  return config_lib.trainer_config(**fields)


def _garble(step_dir):
  for f in (step_dir / 'state').rglob('*'):
    if f.is_file() and f.stat().st_size:
      f.write_bytes(b'garbage')


def _listing(d) -> list[str]:
  return sorted(str(p.relative_to(d)) for p in d.rglob('*'))


# ------------------------------------------------- corrupt checkpoints


def test_all_checkpoints_corrupt_refuses_a_silent_fresh_start(tmp_path):
  workdir = tmp_path / 'run'
  fit.fit(_task(), _cfg(), str(workdir))
  ck = workdir / 'checkpoints'
  for step in (4, 8):
    _garble(ck / str(step))
  with pytest.raises(faults.AllCheckpointsCorruptError) as err:
    fit.fit(_task(), _cfg(), str(workdir))
  line = str(err.value)
  assert '4.corrupt' in line and '8.corrupt' in line
  assert '--allow_fresh_start' in line and '\n' not in line
  assert faults.explain(err.value)[0] == faults.CORRUPT_FILES
  # Refused again on the next start (the set-aside copies stay).
  with pytest.raises(faults.AllCheckpointsCorruptError):
    fit.fit(_task(), _cfg(), str(workdir))
  assert (ck / '4.corrupt').is_dir() and (ck / '8.corrupt').is_dir()
  again = fit.fit(_task(), _cfg(), str(workdir), allow_fresh_start=True)
  assert again.summary['start_step'] == 0 and again.summary['finished']
  assert (ck / '8.corrupt').is_dir()  # Still kept.


def test_a_reader_never_moves_a_held_runs_checkpoint(tmp_path):
  workdir = tmp_path / 'run'
  fit.fit(_task(), _cfg(), str(workdir))
  ck = workdir / 'checkpoints'
  _garble(ck / '8')
  before = _listing(workdir)
  with WorkdirLock(str(workdir), enabled=True):  # A live run holds it.
    state = fit.restore_newest(_task(), _cfg(), str(workdir))
    assert int(state.step) == 4  # Fell back without moving anything.
    assert _listing(workdir) == sorted([*before, '.lock'])
  assert _listing(workdir) == before
  _garble(ck / '4')
  with pytest.raises(faults.AllCheckpointsCorruptError, match='unreadable'):
    fit.restore_newest(_task(), _cfg(), str(workdir))
  assert _listing(workdir) == before
  # The writer (lock holder) sets them aside.
  with pytest.raises(faults.AllCheckpointsCorruptError):
    fit.fit(_task(), _cfg(), str(workdir))
  assert (ck / '8.corrupt').is_dir() and not (ck / '8').exists()


# ------------------------------------------------------------- signals


def test_sigterm_in_the_final_phase_exits_preempted_with_a_summary(tmp_path):
  calls = []

  def summary(result):
    calls.append(result.step)
    if len(calls) == 1:
      os.kill(os.getpid(), signal.SIGTERM)
      pytest.fail('the final phase went on after SIGTERM')
    return {'final': 1.0}

  def run():  # The final phase runs after fit returns.
    result = fit.fit(_task(), _cfg(), str(workdir))
    return fit.finish(result, lambda result, writer: summary(result))

  workdir = tmp_path / 'run'
  out = run()
  assert out['preempted_at_step'] == 8 and out['status'] == 'preempted'
  saved = json.loads((workdir / 'summary.json').read_text())
  assert saved['status'] == 'preempted' and saved['steps'] == 8
  done = run()
  assert done['status'] == 'ok' and done['final'] == 1.0
  assert calls == [8, 8]


def test_sigterm_during_the_last_save_keeps_it_and_skips_the_final_phase(
  tmp_path, monkeypatch
):
  real_save = Checkpointer.save

  def save(self, step, *a, **kw):
    started = real_save(self, step, *a, **kw)
    if step == 8:  # The final (forced) save: after the loop's last check.
      os.kill(os.getpid(), signal.SIGTERM)
    return started

  monkeypatch.setattr(Checkpointer, 'save', save)
  ran = []
  out = fit.finish(
    fit.fit(_task(), _cfg(checkpoint_every=3), str(tmp_path)),
    lambda result, writer: ran.append(1) or {},
  )
  assert out['status'] == 'preempted' and out['preempted_at_step'] == 8
  assert ran == []  # The final phase was left for the restart.
  ck = Checkpointer(str(tmp_path / 'checkpoints'))
  assert ck.latest_step() == 8  # The last save completed.
  ck.close()


# ---------------------------------------------------------------- disk


@pytest.mark.parametrize(
  'code, said',
  [(errno.ENOSPC, 'The disk is full'), (errno.EACCES, 'Permission denied')],
)
def test_a_failed_save_is_one_line_naming_why_where_and_what_was_kept(
  tmp_path, monkeypatch, code, said
):
  workdir = tmp_path / 'run'
  real = Checkpointer.save

  def save(self, step, *a, **kw):
    if step == 8:
      monkeypatch.setattr(
        self.manager,
        'save',
        lambda *a, **kw: (_ for _ in ()).throw(
          OSError(code, os.strerror(code), str(self.directory))
        ),
      )
    return real(self, step, *a, **kw)

  monkeypatch.setattr(Checkpointer, 'save', save)
  with pytest.raises(CheckpointSaveError) as err:
    fit.fit(_task(), _cfg(), str(workdir))
  got = faults.explain(err.value)
  assert got[0] == faults.WRITE_FAILED
  line = got[1]
  assert said in line and str(workdir / 'checkpoints') in line
  assert 'newest kept: step 4' in line and '\n' not in line


def test_unwritable_workdirs_are_one_line(tmp_path, monkeypatch):
  afile = tmp_path / 'afile'
  afile.write_text('x')
  c = quickstart.get_config('smoke')
  c.mesh.shape = (1, 1, 1)
  for workdir in (afile, afile / 'sub'):
    with pytest.raises(OSError) as err:
      lm.train_and_evaluate(c, str(workdir))
    code, line = faults.explain(err.value)
    assert code == faults.WRITE_FAILED and str(workdir) in line
  assert afile.read_text() == 'x'
  real_open = os.open

  def read_only(path, *a, **kw):
    if str(path).startswith(str(tmp_path / 'ro')):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return real_open(path, *a, **kw)

  monkeypatch.setattr(os, 'open', read_only)
  with pytest.raises(OSError) as err:
    lm.train_and_evaluate(c, str(tmp_path / 'ro'))
  code, line = faults.explain(err.value)
  assert code == faults.WRITE_FAILED and 'read-only' in line


# ------------------------------------------------- no writes before refusal


def _smoke(**overrides):
  c = quickstart.get_config('smoke')
  c.mesh.shape = (1, 1, 1)
  return override(c, overrides)


@pytest.mark.parametrize('mode', ['eval', 'sample'])
def test_reader_modes_on_an_empty_workdir_write_nothing(tmp_path, mode):
  workdir = tmp_path / 'empty'
  workdir.mkdir()
  with pytest.raises(NoCheckpointError) as err:
    modes.run(_smoke(), str(workdir), mode)
  assert faults.explain(err.value)[0] == faults.NO_INPUT
  assert os.listdir(workdir) == []


def test_state_tracking_eval_on_an_empty_workdir_writes_nothing(tmp_path):
  from experiments.configs import state_tracking

  c = state_tracking.get_config('pdssm,parity,smoke')
  workdir = tmp_path / 'st'
  with pytest.raises(NoCheckpointError):
    modes.run(c, str(workdir), 'eval')
  assert not workdir.exists()


# ------------------------------------------------- validation before compute


@pytest.mark.parametrize(
  'overrides, match',
  [
    ({'sample.sampler': 'scheduled'}, 'sample.light_workdir'),
    (
      {'sample.sampler': 'scheduled', 'sample.light_workdir': '/nonexistent'},
      'not a run directory',
    ),
    ({'sample.prefix': 'the quick brown fox ' * 4}, 'data.seq_len=32'),
    ({'sample.prefix': 'caf\u00e9 \u2603'}, r'U\+00E9\), .* \(U\+2603\)'),
  ],
  ids=['scheduled_no_light', 'light_not_a_run', 'long_prefix', 'non_ascii'],
)
def test_sample_settings_refused_before_training(tmp_path, overrides, match):
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError, match=match):
    lm.train_and_evaluate(_smoke(**overrides), str(workdir))
  assert not (workdir / 'checkpoints').exists()
  assert not (workdir / 'metrics.jsonl').exists()


def test_a_prompt_the_tokenizer_cannot_hold_is_named():
  tok = CharTokenizer('abcdefghijklmnopqrstuvwxyz ')
  with pytest.raises(ConfigError) as err:
    check_prompt('na\u00efve caf\u00e9', tok, 64)
  assert "'\u00ef' (U+00EF)" in str(err.value)
  assert "'\u00e9' (U+00E9)" in str(err.value)
  ids = check_prompt('naive cafe', tok, 64)
  assert tok.decode(ids) == 'naive cafe'


# --------------------------------------------------------- the AR prompt


def test_autoregressive_sampling_continues_the_prompt():
  vocab, length = 7, 12

  def apply(x_BxL, t_B):  # Always predicts token 5 (at any position).
    del t_B
    return jnp.where(jnp.arange(vocab) == 5, 10.0, -10.0)[None, None] + (
      0.0 * x_BxL[..., None]
    )

  from ddlm_jax.diffusion.autoregressive import Autoregressive

  process = Autoregressive(vocab_size=vocab)
  prefix = np.array([[1, 2, 3]], np.int32)
  tokens, nfe = autoregressive_sample(
    apply,
    jax.random.key(0),
    process,
    batch=2,
    length=length,
    prefix_BxP=prefix.repeat(2, 0),
  )
  tokens = np.asarray(tokens)
  assert (tokens[:, :3] == [1, 2, 3]).all() and (tokens[:, 3:] == 5).all()
  assert int(nfe) == length - 3


_PROMPTED = {
  'ar': (ar_quickstart, 'smoke', {}),
  'mdlm': (quickstart, 'smoke', {}),
  'mdlm_eb': (quickstart, 'smoke', {'sample.sampler': 'eb:gamma=0.1'}),
  'bd3': (bd3_quickstart, '16,smoke', {}),
  'duo': (duo_quickstart, 'smoke', {}),
  'interpolating': (duo_quickstart, 'interpolating,smoke', {}),
}


@pytest.mark.slow
@pytest.mark.parametrize('family', sorted(_PROMPTED))
def test_every_sampler_with_a_prompt_starts_with_it(tmp_path, family):
  make, arg, overrides = _PROMPTED[family]
  c = override(make.get_config(arg), overrides)
  c.mesh.shape = (1, 1, 1)
  c.train.num_steps = 2
  c.sample.prefix = 'the '
  c.sample.num_samples = 2
  lm.train_and_evaluate(c, str(tmp_path))
  text = (tmp_path / 'samples.txt').read_text()
  samples = [s.split('\n', 1)[1] for s in text.split('=== sample ')[1:]]
  assert len(samples) == 2 and all(s.startswith('the ') for s in samples)


# ----------------------------------------------------- files named in errors


def test_corrupt_config_and_tokenizer_files_are_named(tmp_path):
  run = tmp_path / 'src'
  run.mkdir()
  (run / 'config.json').write_text('{"model": {"wid')
  with pytest.raises(faults.CorruptFileError) as err:
    load_config(str(run))
  assert str(run / 'config.json') in str(err.value)
  assert faults.explain(err.value)[0] == faults.CORRUPT_FILES
  CharTokenizer('abc').save(run / 'tokenizer')
  c = _smoke(**{'train.init_from': str(run)})
  with pytest.raises(faults.CorruptFileError, match='config.json'):
    lm.train_and_evaluate(c, str(tmp_path / 'warm'))
  assert not (tmp_path / 'warm').exists() or os.listdir(tmp_path / 'warm') == []
  tok_dir = tmp_path / 'tok'
  CharTokenizer('abc').save(tok_dir)
  (path,) = [p for p in tok_dir.iterdir() if p.suffix == '.json']
  path.write_text(path.read_text()[:10])  # Truncated.
  with pytest.raises(faults.CorruptFileError) as err:
    load_tokenizer(tok_dir)
  assert str(path) in str(err.value)


# --------------------------------------------------------- the command line


def _cli(*args, patch='', timeout=300):
  """python -m experiments.run, optionally after `patch` (Python source)."""
  flags_ = os.environ.get('XLA_FLAGS', '').split()
  kept = ' '.join(f for f in flags_ if 'device_count' not in f)
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=kept)
  code = textwrap.dedent(patch) + (
    "\nimport runpy, sys\nsys.argv = ['experiments.run', *sys.argv[1:]]\n"
    "runpy.run_module('experiments.run', run_name='__main__')\n"
  )
  return subprocess.run(
    [sys.executable, '-c', code, *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
  )


_READ_ONLY = """
import errno, os
_open = os.open
def _ro(path, *a, **kw):
  if '/ro_workdir' in str(path):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
  return _open(path, *a, **kw)
os.open = _ro
"""


@pytest.mark.slow
def test_cli_faults_are_one_line_with_their_exit_code(tmp_path):
  qs = 'experiments/configs/quickstart.py'
  st = 'experiments/configs/state_tracking.py'
  afile = tmp_path / 'afile'
  afile.write_text('x')
  empty = tmp_path / 'empty'
  empty.mkdir()
  cases = [
    ([f'--config={qs}:smok'], faults.BAD_INPUT, "unknown preset 'smok'"),
    ([f'--config={st}:pdssm,parityy,smoke'], 2, "unknown task 'parityy'"),
    (['--config=experiments/configs/nope.py'], 2, 'no such config file'),
    ([f'--config={qs}:smoke', f'--workdir={afile}'], 74, 'in the way'),
    ([f'--config={qs}:smoke', f'--workdir={tmp_path}/ro_workdir'], 74, ''),
    (['--mode=eval', f'--workdir={empty}'], 66, 'config.json not found'),
    (
      [f'--config={qs}:smoke', '--mode=sample', f'--workdir={empty}'],
      faults.NO_INPUT,
      'No checkpoint in',
    ),
  ]
  for args, code, said in cases:
    if not any(a.startswith('--workdir') for a in args):
      args = [*args, f'--workdir={tmp_path / "unused"}']
    out = _cli(*args, patch=_READ_ONLY)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, (args, out.stderr[-3000:])
    assert len(lines) == 1 and said in lines[0], (args, out.stderr)
    assert lines[0].startswith('error: ')
  assert (
    'read-only'
    in _cli(
      f'--config={qs}:smoke',
      f'--workdir={tmp_path}/ro_workdir',
      patch=_READ_ONLY,
    ).stderr
  )
  assert os.listdir(empty) == [] and not (tmp_path / 'unused').exists()
  debug = _cli(f'--config={qs}:smoke', f'--workdir={afile}', '--debug')
  assert 'Traceback' in debug.stderr and debug.returncode != 0


_DISK_FULL = """
import errno, os
import orbax.checkpoint as ocp
_save = ocp.CheckpointManager.save
def _full(self, step, *a, **kw):
  if step >= 4:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory))
  return _save(self, step, *a, **kw)
ocp.CheckpointManager.save = _full
"""


@pytest.mark.slow
def test_cli_disk_full_mid_run_then_workdir_only_modes(tmp_path):
  qs = 'experiments/configs/quickstart.py:smoke'
  args = [
    f'--config={qs}',
    f'--workdir={tmp_path}',
    '--config.train.checkpoint_every=2',
  ]
  out = _cli(*args, patch=_DISK_FULL)
  assert out.returncode == faults.WRITE_FAILED, out.stderr[-3000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) <= 2 and 'Traceback' not in out.stderr, out.stderr
  assert 'The disk is full' in lines[-1] and 'newest kept: step 2' in lines[-1]
  done = _cli(*args)  # Space again: resumes and finishes.
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'resumed from step 2' in done.stdout
  # eval and sample with only --workdir: the run's config.json.
  ev = _cli(f'--workdir={tmp_path}', '--mode=eval')
  assert ev.returncode == 0, ev.stderr[-3000:]
  assert json.loads((tmp_path / 'eval_validation.json').read_text())['step']
  sa = _cli(f'--workdir={tmp_path}', '--mode=sample')
  assert sa.returncode == 0, sa.stderr[-3000:]


def _mount_tmpfs(path, size: str) -> bool:
  path.mkdir(exist_ok=True)
  try:
    out = subprocess.run(
      ['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
      capture_output=True,
      timeout=30,
    )
  except (OSError, subprocess.TimeoutExpired):
    return False
  return out.returncode == 0


@pytest.mark.slow
def test_cli_a_really_full_disk_is_one_line_and_resumes(tmp_path):
  """A small tmpfs fills during a background save (needs mount rights)."""
  small = tmp_path / 'small'
  if not _mount_tmpfs(small, '500k'):
    pytest.skip('cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)')
  try:
    args = [
      '--config=experiments/configs/quickstart.py:smoke',
      f'--workdir={small / "run"}',
      '--config.train.checkpoint_every=2',
    ]
    out = _cli(*args)
    assert out.returncode == faults.WRITE_FAILED, out.stderr[-3000:]
    # orbax's error logs are dropped and stderr is closed right after the
    # run's one line (faults.exit_now), so nothing prints after it. But
    # tensorstore's native write callbacks can print asyncio's 'Event loop
    # is closed' traceback below Python's hooks *while* the line is being
    # written (seen about once in ten runs); that native traceback, and
    # only it, is allowed around the run's line, which must be whole.
    ours = re.findall(r'error: Saving checkpoint .*? to resume\.', out.stderr)
    assert len(ours) == 1, out.stderr
    assert 'The disk is full' in ours[0] and 'newest kept:' in ours[0]
    rest = out.stderr.replace(ours[0], '\n')
    files = re.findall(r'File "([^"]+)"', rest)
    assert all(f.endswith('asyncio/base_events.py') for f in files), rest
    errors = re.findall(r'\b(\w+Error): ', rest)
    assert set(errors) <= {'RuntimeError'}, rest
    closed = rest.count('RuntimeError: Event loop is closed')
    assert rest.count('RuntimeError: ') == closed, rest
    leftover = [
      line
      for line in rest.splitlines()
      if line.strip()
      and not line.strip().startswith(('Traceback', 'File ', 'self.', 'raise '))
      and 'Event loop is closed' not in line
      and not set(line.strip()) <= set('^~ ')
    ]
    assert not leftover, rest
    subprocess.run(['mount', '-o', 'remount,size=16M', str(small)], check=True)
    done = _cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'resumed from step' in done.stdout
  finally:
    subprocess.run(['umount', str(small)], capture_output=True)


@pytest.mark.slow
def test_state_tracking_eval_needs_only_the_workdir(tmp_path):
  from experiments.configs import state_tracking

  c = state_tracking.get_config('pdssm,parity,smoke')
  c.train.num_steps = 2
  workdir = str(tmp_path / 'st')
  modes.run(c, workdir, 'train')
  saved = modes.saved_config(workdir, 'eval')
  assert saved.kind == 'state_tracking'
  out = modes.run(saved, workdir, 'eval')
  assert out['step'] == 2 and 0.0 <= out['accuracy'] <= 1.0
  with pytest.raises(ConfigError, match='--mode=train needs --config'):
    modes.saved_config(workdir, 'train')


def test_exit_codes_are_distinct_and_documented():
  codes = {
    name: getattr(faults, name)
    for name in dir(faults)
    if name.isupper() and isinstance(getattr(faults, name), int)
  }
  assert len(set(codes.values())) == len(codes), codes
  with open(os.path.join(ROOT, 'docs', 'FAULTS.md')) as f:
    table = f.read()
  for name, code in codes.items():
    assert f'\n| {code} |' in table, (name, code)
  assert fit.PREEMPTED_EXIT_CODE == faults.PREEMPTED
  diverged = fit.TrainingDivergedError('non-finite at step 3')
  assert faults.explain(diverged) == (faults.DIVERGED, 'non-finite at step 3')
  assert faults.explain(KeyError('a bug')) is None  # Keeps its traceback.


@pytest.mark.slow
def test_cli_all_checkpoints_corrupt_exits_65_until_allowed(tmp_path):
  args = [
    '--config=experiments/configs/quickstart.py:smoke',
    f'--workdir={tmp_path}',
    '--config.sample.num_samples=0',
  ]
  assert _cli(*args).returncode == 0
  ck = tmp_path / 'checkpoints'
  for step in [p for p in ck.iterdir() if p.name.isdigit()]:
    _garble(step)
  out = _cli(*args)
  assert out.returncode == faults.CORRUPT_FILES, out.stderr[-3000:]
  # One warning line per checkpoint set aside, then the refusal.
  lines = out.stderr.strip().splitlines()
  assert len(lines) <= 3 and 'Traceback' not in out.stderr, out.stderr
  assert lines[-1].startswith('error: Every checkpoint') and (
    '.corrupt' in lines[-1] and '--allow_fresh_start' in lines[-1]
  )
  assert not (tmp_path / 'summary.json').read_text().count('"start_step": 6')
  fresh = _cli(*args, '--allow_fresh_start')
  assert fresh.returncode == 0, fresh.stderr[-3000:]
  assert 'training from step 0 as asked' in fresh.stdout
  assert any('.corrupt' in p.name for p in ck.iterdir())  # Still kept.


@pytest.mark.slow
def test_cli_planner_stage_all_corrupt_exits_65_until_allowed(tmp_path):
  """A planner/executor stage refuses a silent retrain like an LM run."""
  args = [
    '--config=experiments/configs/planner_executor.py:direct,smoke',
    f'--workdir={tmp_path}',
  ]
  assert _cli(*args).returncode == 0
  ck = tmp_path / 'models' / 'direct' / 'checkpoints'
  steps = [p for p in ck.iterdir() if p.name.isdigit()]
  assert steps
  for step in steps:
    _garble(step)
  out = _cli(*args)
  assert out.returncode == faults.CORRUPT_FILES, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert 'Traceback' not in out.stderr, out.stderr
  assert last.startswith('error: Every checkpoint') and str(ck) in last
  assert '.corrupt' in last and '--allow_fresh_start' in last
  assert not any(p.name.isdigit() for p in ck.iterdir())  # Nothing trained.
  fresh = _cli(*args, '--allow_fresh_start')
  assert fresh.returncode == 0, fresh.stderr[-3000:]
  assert 'training from step 0 as asked' in fresh.stdout
  names = {p.name for p in ck.iterdir()}
  assert {f'{p.name}.corrupt' for p in steps} <= names  # Still kept.
  assert {p.name for p in steps} <= names  # Trained again.


_SIGTERM_IN_SAMPLING = """
import os, signal, time
import ddlm_jax.tasks.language_model as run_lib
def _sample(*a, **kw):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(30)  # The signal must cut this short.
  raise AssertionError('sampling went on after SIGTERM')
run_lib.sample_and_score = _sample
"""


@pytest.mark.slow
def test_cli_sigterm_during_final_sampling_exits_75_with_a_summary(tmp_path):
  out = _cli(
    '--config=experiments/configs/quickstart.py:smoke',
    f'--workdir={tmp_path}',
    patch=_SIGTERM_IN_SAMPLING,
  )
  assert out.returncode == faults.PREEMPTED, out.stderr[-3000:]
  assert 'SIGTERM during the final evaluation/sampling' in out.stdout
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['status'] == 'preempted' and summary['steps'] == 6
