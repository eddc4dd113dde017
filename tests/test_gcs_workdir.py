"""A gs:// workdir end to end, on a local stand-in for the bucket.

The stand-in serves gs:// from a temporary directory through the two
routes a real bucket is reached by: fsspec (which `etils.epath` uses for
gs:// when TensorFlow is absent; the suite's own reads and writes and
orbax's metadata) and TensorStore's kvstore (orbax's array data, given a
`file` driver in place of `gcs`). Bucket-only services orbax asks about
(hierarchical namespaces) answer as a plain bucket does. Everything else is
the code a real gs:// run executes: paths stay `gs://...` strings
throughout, and nothing may land in the local working directory.
"""

import json
import os
import sys
import time

import numpy as np
import pytest

fsspec = pytest.importorskip('fsspec')
epath = pytest.importorskip('etils.epath')

from fsspec.implementations.dirfs import DirFileSystem  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from ddlm_jax import paths  # noqa: E402
from ddlm_jax.errors import WorkdirLockedError  # noqa: E402
from ddlm_jax.training.workdir_lock import WorkdirLock  # noqa: E402


class LocalBucket(DirFileSystem):
  """gs://BUCKET/KEY as ROOT/BUCKET/KEY (names relative, as gcsfs's are)."""

  protocol = ('gs', 'gcs')
  root = ''

  def __init__(self, *args, **kwargs):
    del args, kwargs  # gcsfs options (finalize_on_close, ...).
    super().__init__(path=type(self).root, fs=LocalFileSystem())


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  """gs://bucket/run on the stand-in; (uri, local root of the bucket)."""
  import etils.epath.backend as backend
  import etils.epath.gpath as gpath
  from orbax.checkpoint._src.path import gcs_utils

  if gpath._is_tf_installed():  # epath would use tf.io.gfile instead.
    pytest.skip('TensorFlow is installed: epath reads gs:// through tf.io')
  needed = ('parse_gcs_path', 'get_kvstore_for_gcs')
  needed += ('is_hierarchical_namespace_enabled',)
  missing = [n for n in needed if not hasattr(gcs_utils, n)]
  if missing:
    pytest.skip(f'this orbax reaches GCS without gcs_utils.{missing[0]}')
  root = tmp_path / 'store'
  root.mkdir()
  monkeypatch.setattr(LocalBucket, 'root', str(root))
  registry = sys.modules['fsspec.registry']._registry
  for name in LocalBucket.protocol:
    monkeypatch.setitem(registry, name, LocalBucket)
  _forget_filesystems(backend)

  def kvstore(path):
    name, key = gcs_utils.parse_gcs_path(path, add_trailing_slash=False)
    return {'driver': 'file', 'path': f'{root}/{name}/{key}'}

  monkeypatch.setattr(gcs_utils, 'get_kvstore_for_gcs', kvstore)
  monkeypatch.setattr(
    gcs_utils, 'is_hierarchical_namespace_enabled', lambda path: False
  )
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  monkeypatch.chdir(cwd)  # A path taken for local would land here.
  yield 'gs://bucket/run', root / 'bucket' / 'run'
  assert not os.listdir(cwd), 'a gs:// path was written to the local disk'
  _forget_filesystems(backend)


def _forget_filesystems(backend):
  """Drops cached filesystems, so gs:// is served from this test's root."""
  LocalBucket.clear_instance_cache()
  cached = backend.fsspec_backend._get_filesystem
  if hasattr(cached, 'cache_clear'):
    cached.cache_clear()


def test_paths_keep_uris_and_make_local_paths_absolute(tmp_path):
  assert paths.is_remote('gs://b/r') and not paths.is_remote('runs/a')
  assert not paths.is_remote('file:///tmp/a')
  assert paths.absolute('gs://b/r/') == 'gs://b/r'
  assert paths.absolute('runs/a') == os.path.abspath('runs/a')
  assert paths.join('gs://b/r/', 'checkpoints', '3') == 'gs://b/r/checkpoints/3'
  assert paths.join(str(tmp_path), 'x') == os.path.join(str(tmp_path), 'x')


def test_path_functions_reach_the_bucket(bucket):
  uri, local = bucket
  paths.write_text(paths.join(uri, 'tokenizer', 'a.json'), '{}')
  assert (local / 'tokenizer' / 'a.json').read_text() == '{}'
  assert paths.isdir(paths.join(uri, 'tokenizer'))
  assert paths.listdir(uri) == ['tokenizer']
  with pytest.raises(FileNotFoundError):
    paths.listdir(paths.join(uri, 'checkpoints'))
  paths.copy_tree(paths.join(uri, 'tokenizer'), paths.join(uri, 'copy'))
  assert paths.read_text(paths.join(uri, 'copy', 'a.json')) == '{}'
  paths.rename(paths.join(uri, 'copy'), paths.join(uri, 'moved'))
  assert sorted(paths.listdir(uri)) == ['moved', 'tokenizer']
  paths.remove(paths.join(uri, 'moved', 'a.json'))
  paths.remove(paths.join(uri, 'moved', 'a.json'))  # Missing: no error.
  assert not paths.exists(paths.join(uri, 'moved', 'a.json'))


@pytest.mark.slow
def test_train_resume_eval_sample_and_load_a_gs_workdir(bucket):
  import ddlm_jax
  from ddlm_jax.tasks import language_model as loop
  from ddlm_jax.training import progress
  from experiments import modes
  from experiments.configs import quickstart

  uri, local = bucket
  config = quickstart.get_config('smoke')
  config.sample.num_samples = 0
  config.mesh.shape = (1, 1, 1)
  config.train.num_steps = 4
  config.train.eval_every = 2
  config.train.checkpoint_every = 2
  first = loop.train_and_evaluate(config, uri)
  assert first['finished'] and first['start_step'] == 0
  assert sorted(os.listdir(local / 'checkpoints')) == ['2', '4']
  assert (local / 'tokenizer' / 'ddlm_tokenizer.json').is_file()
  assert (local / 'curves.png').read_bytes()[:4] == b'\x89PNG'
  assert not (local / '.lock').exists()  # Released.

  config.train.num_steps = 6  # The same run, longer: it resumes at 4.
  again = loop.train_and_evaluate(config, uri)
  assert again['start_step'] == 4 and again['steps'] == 6
  steps = [
    r['step']
    for r in map(json.loads, (local / 'metrics.jsonl').read_text().splitlines())
    if r['split'] == 'train'
  ]
  assert steps == sorted(set(steps)) and steps[-1] == 6  # No duplicates.

  # --mode=eval|sample with only --workdir: the config is the saved one.
  result = modes.run(modes.saved_config(uri, 'eval'), uri, 'eval')
  assert result['step'] == 6 and np.isfinite(result['bits_per_token'])
  assert json.loads((local / 'eval_validation.json').read_text())['step'] == 6
  saved = modes.saved_config(uri, 'sample')
  saved.sample.num_samples = 2
  stats = modes.run(saved, uri, 'sample')
  assert stats['step'] == 6
  assert len(progress.first_samples(paths.join(uri, 'samples.txt'))) == 2
  text = progress.mode_summary(stats, 'sample', uri)
  assert 'gs://bucket/run/samples.txt' in text

  model = ddlm_jax.load(uri)
  assert model.step == 6
  (scored,) = model.score(['ROMEO:'], samples=2)
  assert np.isfinite(scored.bits_per_token)
  assert len(model.generate(1, steps=4)) == 1


def _lock(uri, **kwargs):
  kwargs = {'settle_s': 0.0, **kwargs}
  return WorkdirLock(uri, enabled=True, **kwargs)


def test_lease_refuses_a_second_run_and_is_released(bucket):
  uri, local = bucket
  with _lock(uri) as lock:
    assert lock.held
    owner = json.loads((local / '.lock').read_text())
    assert owner['pid'] == os.getpid() and owner['token']
    with pytest.raises(WorkdirLockedError, match='in use by pid'):
      _lock(uri).acquire()
  assert not lock.held and not (local / '.lock').exists()
  with _lock(uri):  # Free again.
    pass


def test_stale_lease_is_taken_over_and_a_live_one_renewed(bucket, caplog):
  uri, local = bucket
  local.mkdir(parents=True)
  old = {'pid': 1, 'host': 'gone', 'token': 'x', 'renewed': time.time() - 60}
  (local / '.lock').write_text(json.dumps(old))
  with pytest.raises(WorkdirLockedError, match='expires 600s after'):
    _lock(uri).acquire()  # 60 s old: still live by the default timeout.
  with caplog.at_level('WARNING'):
    lock = _lock(uri, heartbeat_s=0.05, stale_after_s=30).acquire()
  try:
    assert 'Taking over the stale lease' in caplog.text
    first = json.loads((local / '.lock').read_text())['renewed']
    time.sleep(0.3)
    assert json.loads((local / '.lock').read_text())['renewed'] > first
  finally:
    lock.release()
  assert not (local / '.lock').exists()


def test_a_claim_overwritten_while_settling_is_refused(bucket, monkeypatch):
  """Two runs starting together: the one whose lease is read back keeps
  the workdir; the other refuses and deletes nothing."""
  from ddlm_jax.training import workdir_lock

  uri, local = bucket
  rival = {'pid': 2, 'host': 'other', 'token': 'rival', 'renewed': 0.0}

  def rival_lands(lease):
    rival['renewed'] = time.time()
    (local / '.lock').write_text(json.dumps(rival))

  monkeypatch.setattr(workdir_lock._Lease, '_settle', rival_lands)
  lock = _lock(uri, settle_s=1.0)
  with pytest.raises(WorkdirLockedError, match='claimed at the same moment'):
    lock.acquire()
  assert not lock.held
  assert json.loads((local / '.lock').read_text())['token'] == 'rival'


def test_lease_timing_is_checked(bucket):
  with pytest.raises(ValueError, match='heartbeat_s'):
    WorkdirLock(bucket[0], heartbeat_s=700, stale_after_s=600)


def test_plan_and_wandb_id_files_go_to_the_bucket(bucket):
  from ddlm_jax.training import log_backends, plan

  uri, local = bucket
  assert plan.write({'fits': True}, uri) == 'gs://bucket/run/plan.json'
  assert json.loads((local / 'plan.json').read_text()) == {'fits': True}
  first = log_backends._run_id(uri)  # A resumed W&B run keeps its id.
  assert log_backends._run_id(uri) == first
  assert (local / 'wandb_id').read_text() == first


def test_an_unreadable_checkpoint_is_set_aside_in_the_bucket(bucket):
  from test_checkpoint import (
    _abstract,
    _equal,
    _flip_largest_state_file,
    _saved,
    _state,
  )

  from ddlm_jax.training.checkpoint import Checkpointer, has_checkpoint

  uri, local = bucket
  directory = paths.join(uri, 'checkpoints')
  assert not has_checkpoint(directory)
  states = _saved(directory)
  assert has_checkpoint(directory)
  flipped = _flip_largest_state_file(local / 'checkpoints' / '2')
  ckpt = Checkpointer(directory)
  try:
    state, data, step = ckpt.restore_latest(_abstract(_state()))
    assert step == 1 and data == {'pos': 1} and _equal(state, states[1])
    assert ckpt.set_aside() == ['gs://bucket/run/checkpoints/2.corrupt']
    kept = local / 'checkpoints' / '2.corrupt'
    assert (kept / flipped.relative_to(local / 'checkpoints' / '2')).is_file()
    assert ckpt.all_steps() == [1]
  finally:
    ckpt.close()
