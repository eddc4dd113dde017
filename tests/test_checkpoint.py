"""Checkpointer: restores never lose data, saves never go silently wrong."""

import json
import logging
import os
import pathlib
import shutil
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from ddlm_jax.training import checkpoint as ckpt_lib
from ddlm_jax.training.checkpoint import (
  Checkpointer,
  CheckpointSaveError,
  IncompatibleCheckpointError,
  NonFiniteStateError,
)


@flax.struct.dataclass
class State:
  step: Any
  params: Any
  opt_state: Any
  ema_params: Any  # None when EMA is off.
  rng: Any


def _state(*, seed=0, width=64, ema=False, clip=False, shardings=None):
  k = jax.random.key(seed)
  params = {
    'w': jax.random.normal(k, (width, width)),
    'b': jnp.arange(width, dtype=jnp.float32) + seed,
  }
  if shardings is not None:
    params = jax.device_put(params, shardings)
  tx = optax.adam(1e-3)
  if clip:
    tx = optax.chain(optax.clip_by_global_norm(1.0), tx)
  opt_state = tx.init(params)
  # Non-trivial moments, so a restore that mixed them up would show.
  opt_state = jax.tree.map(lambda x: x + 0.5 if x.ndim else x + 3, opt_state)
  return State(
    step=jnp.array(seed, jnp.int32),
    params=params,
    opt_state=opt_state,
    ema_params=jax.tree.map(lambda x: x * 0.9, params) if ema else None,
    rng=jax.random.key(seed + 100),
  )


def _abstract(state, sharding=None):
  sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
    state,
  )


def _equal(a, b) -> bool:
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  if ta != tb:
    return False
  unkey = lambda x: (
    jax.random.key_data(x)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    else x
  )
  return all(
    np.array_equal(np.asarray(unkey(x)), np.asarray(unkey(y)))
    for x, y in zip(la, lb)
  )


def _saved(directory, steps=(1, 2), **kw) -> dict:
  """Writes a checkpoint per step (state seeded by the step); returns them."""
  c = Checkpointer(directory, **kw)
  states = {}
  for s in steps:
    states[s] = _state(seed=s)
    assert c.save(s, states[s], {'pos': s})
  c.close()
  return states


def _listing(directory) -> list[str]:
  return sorted(os.listdir(directory))


def _flip_largest_state_file(step_dir: pathlib.Path) -> pathlib.Path:
  files = [f for f in (step_dir / 'state').rglob('*') if f.is_file()]
  target = max(files, key=lambda f: f.stat().st_size)
  data = bytearray(target.read_bytes())
  mid = len(data) // 2
  for i in range(mid, mid + 16):
    data[i] ^= 0xFF
  target.write_bytes(bytes(data))
  return target


def test_round_trip_and_manifest(tmp_path):
  d = str(tmp_path / 'ck')
  states = _saved(d)
  c = Checkpointer(d)
  assert c.all_steps() == [1, 2] and c.latest_step() == 2
  state, data, step = c.restore_latest(_abstract(states[2]))
  assert step == 2 and data == {'pos': 2}
  assert _equal(state, states[2])
  assert c.last_restore_changes == []
  meta = json.loads((tmp_path / 'ck' / '2' / 'meta' / 'metadata').read_text())
  # The whole tree, not only params; typed keys as their key data.
  assert meta['manifest']['opt_state/0/mu/w'] == [[64, 64], 'float32']
  assert meta['manifest']['rng'] == [[2], 'uint32']
  s, q = meta['fingerprints']['params/b']
  b = np.arange(64, dtype=np.float64) + 2
  np.testing.assert_allclose([s, q], [b.sum(), (b * b).sum()], rtol=1e-6)
  c.close()


def test_restore_onto_another_sharding(tmp_path):
  """Fingerprints tolerate the other summation order of a new mesh."""
  mesh = jax.make_mesh((8,), ('x',))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('x'))
  saved = _state(seed=3, shardings=rows)
  c = Checkpointer(str(tmp_path), async_=False)
  c.save(3, saved, None)
  c.close()
  mesh2 = jax.make_mesh((2, 4), ('a', 'b'))
  cols = jax.sharding.NamedSharding(
    mesh2, jax.sharding.PartitionSpec(None, ('a', 'b'))
  )
  target = _abstract(_state(seed=0), sharding=None)
  target = target.replace(
    params={
      'w': jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=cols),
      'b': target.params['b'],
    }
  )
  c = Checkpointer(str(tmp_path))
  state, data, step = c.restore_latest(target)
  assert step == 3 and data == {}
  assert state.params['w'].sharding == cols
  assert _equal(state, saved)
  c.close()


def test_max_to_keep_validated_and_newest_kept(tmp_path):
  for bad in (0, -1, None):
    with pytest.raises(ValueError, match='train.max_checkpoints'):
      Checkpointer(str(tmp_path / 'x'), max_to_keep=bad)
  d = str(tmp_path / 'ck')
  _saved(d, steps=(1, 2, 3), max_to_keep=1)
  assert Checkpointer(d).all_steps() == [3]


def test_same_step_again_is_a_no_op(tmp_path):
  c = Checkpointer(str(tmp_path))
  assert c.save(1, _state(seed=1), {'pos': 1})
  assert not c.save(1, _state(seed=9), {'pos': 9}, force=True)
  c.close()
  state, data, _ = Checkpointer(str(tmp_path)).restore_latest(
    _abstract(_state())
  )
  assert data == {'pos': 1} and _equal(state, _state(seed=1))


def test_param_shape_change_is_refused_untouched(tmp_path):
  d = str(tmp_path)
  _saved(d)
  before = _listing(d)
  c = Checkpointer(d)
  with pytest.raises(IncompatibleCheckpointError, match=r"params/w|\['w'\]"):
    c.restore_latest(_abstract(_state(width=32)), initial_state=_state())
  assert _listing(d) == before


@pytest.mark.parametrize('saved_ema', [True, False])
def test_ema_toggle_keeps_every_checkpoint(tmp_path, caplog, saved_ema):
  d = str(tmp_path)
  saved = _state(seed=2, ema=saved_ema)
  c = Checkpointer(d)
  c.save(2, saved, {'pos': 2})
  c.close()
  before = _listing(d)
  target = _state(seed=0, ema=not saved_ema)
  c = Checkpointer(d)
  with caplog.at_level(logging.WARNING):
    state, _, step = c.restore_latest(_abstract(target))
  assert step == 2 and _listing(d) == before  # Nothing quarantined.
  assert _equal(state.params, saved.params)
  assert _equal(state.opt_state, saved.opt_state)
  if saved_ema:  # EMA switched off: dropped.
    assert state.ema_params is None
  else:  # EMA switched on: starts at the restored params, in its own buffer.
    assert _equal(state.ema_params, saved.params)
    assert (
      state.ema_params['w'].unsafe_buffer_pointer()
      != state.params['w'].unsafe_buffer_pointer()
    )
  assert any('ema_params' in x for x in c.last_restore_changes)
  assert 'ema_params' in caplog.text


def test_optimizer_structure_change_restores_the_rest(tmp_path, caplog):
  d = str(tmp_path)
  states = _saved(d)
  before = _listing(d)
  initial = _state(seed=7, clip=True)  # grad_clip on: another optax chain.
  c = Checkpointer(d)
  # Without the concrete initial state it cannot fill in: refuse, untouched.
  with pytest.raises(IncompatibleCheckpointError, match='opt_state'):
    c.restore_latest(_abstract(initial))
  assert _listing(d) == before
  with caplog.at_level(logging.WARNING):
    state, data, step = c.restore_latest(
      _abstract(initial), initial_state=initial
    )
  assert step == 2 and data == {'pos': 2} and _listing(d) == before
  assert _equal(state.params, states[2].params)
  assert _equal(state.rng, states[2].rng) and int(state.step) == 2
  assert _equal(state.opt_state, initial.opt_state)
  assert [x.split(':')[0] for x in c.last_restore_changes] == ['opt_state']
  assert 'opt_state' in caplog.text and 'freshly initialised' in caplog.text


def test_param_dtype_change_is_cast_and_reported(tmp_path):
  states = _saved(str(tmp_path), steps=(1,))
  target = _abstract(_state())
  target = target.replace(
    params=jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(
        x.shape, jnp.bfloat16, sharding=x.sharding
      ),
      target.params,
    )
  )
  c = Checkpointer(str(tmp_path))
  state, _, step = c.restore_latest(target)
  assert step == 1 and state.params['w'].dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    np.asarray(state.params['w'].astype(jnp.float32)),
    np.asarray(states[1].params['w'].astype(jnp.bfloat16).astype(jnp.float32)),
  )
  assert _equal(state.opt_state, states[1].opt_state)
  assert len(c.last_restore_changes) == 1
  assert 'params/w float32->bfloat16' in c.last_restore_changes[0]


def test_flipped_bytes_fall_back_and_keep_the_copy(tmp_path):
  d = tmp_path / 'ck'
  states = _saved(str(d))
  flipped = _flip_largest_state_file(d / '2')
  content = flipped.read_bytes()
  c = Checkpointer(str(d))
  state, data, step = c.restore_latest(_abstract(_state()))
  assert step == 1 and data == {'pos': 1} and _equal(state, states[1])
  kept = d / '2.corrupt' / flipped.relative_to(d / '2')
  assert kept.read_bytes() == content
  assert c.all_steps() == [1]
  c.close()


def test_quarantine_never_overwrites(tmp_path):
  d = tmp_path / 'ck'
  _saved(str(d), steps=(1, 2))
  (d / '2.corrupt').mkdir()
  (d / '2.corrupt' / 'earlier').write_text('an earlier quarantine')
  for f in (d / '2' / 'state').rglob('*'):
    if f.is_file() and f.stat().st_size:
      f.write_bytes(b'garbage')
  # Step 1 goes too: both land aside, nothing is left to restore.
  for f in (d / '1' / 'state').rglob('*'):
    if f.is_file() and f.stat().st_size:
      f.write_bytes(b'garbage')
  c = Checkpointer(str(d))
  assert c.restore_latest(_abstract(_state())) is None
  assert (d / '2.corrupt' / 'earlier').read_text() == 'an earlier quarantine'
  assert (d / '2.corrupt.1' / 'state').is_dir()
  assert (d / '1.corrupt' / 'state').is_dir()
  c.close()


def test_values_that_differ_from_the_fingerprint_fall_back(tmp_path):
  """Readable files with other values (here: step 1's) are not trusted."""
  d = tmp_path / 'ck'
  states = _saved(str(d), steps=(1, 2, 3))
  shutil.rmtree(d / '3' / 'state')
  shutil.copytree(d / '1' / 'state', d / '3' / 'state')
  c = Checkpointer(str(d))
  state, _, step = c.restore_latest(_abstract(_state()))
  assert step == 2 and _equal(state, states[2])
  assert (d / '3.corrupt').is_dir()


def test_non_finite_values_on_disk_fall_back(tmp_path):
  """NaN params on disk (no fingerprint to catch them) are refused too."""
  d = tmp_path / 'ck'
  states = _saved(str(d), steps=(1, 2))
  raw = tmp_path / 'raw'
  bad = _state(seed=2)
  bad = bad.replace(params={**bad.params, 'b': bad.params['b'] * jnp.nan})
  with ocp.CheckpointManager(
    raw, item_handlers={'state': ocp.PyTreeCheckpointHandler()}
  ) as m:
    m.save(2, args=ocp.args.Composite(state=ocp.args.PyTreeSave(bad)))
  shutil.rmtree(d / '2' / 'state')
  shutil.copytree(raw / '2' / 'state', d / '2' / 'state')
  meta_file = d / '2' / 'meta' / 'metadata'
  meta = json.loads(meta_file.read_text())
  del meta['fingerprints']
  meta_file.write_text(json.dumps(meta))
  c = Checkpointer(str(d))
  state, _, step = c.restore_latest(_abstract(_state()))
  assert step == 1 and _equal(state, states[1])
  assert (d / '2.corrupt').is_dir()


def test_save_refuses_non_finite_state(tmp_path):
  c = Checkpointer(str(tmp_path))
  c.save(1, _state(seed=1), None)
  s = _state(seed=2)
  nan_params = s.replace(
    params={**s.params, 'w': s.params['w'].at[0].set(jnp.inf)}
  )
  mu = s.opt_state[0].mu
  nan_opt = s.replace(
    opt_state=(s.opt_state[0]._replace(mu={**mu, 'b': mu['b'] / 0.0 * 0}),)
    + s.opt_state[1:]
  )
  for bad, where in ((nan_params, 'params/w'), (nan_opt, 'opt_state/0/mu/b')):
    with pytest.raises(NonFiniteStateError, match=where) as info:
      c.save(2, bad, None)
    assert isinstance(info.value, FloatingPointError)
  c.close()
  assert Checkpointer(str(tmp_path)).all_steps() == [1]


def _break_writes(directory: pathlib.Path):
  """Makes writing under `directory` fail; returns an undo function."""
  if os.geteuid() != 0:
    directory.chmod(0o500)
    return lambda: directory.chmod(0o700)
  # Root ignores permissions: put a file where the directory was.
  aside = directory.with_name(directory.name + '.aside')
  directory.rename(aside)
  directory.write_text('not a directory')

  def undo():
    directory.unlink()
    aside.rename(directory)

  return undo


@pytest.mark.parametrize('async_', [True, False])
def test_failed_save_raises_and_keeps_the_previous(tmp_path, async_):
  d = tmp_path / 'ck'
  c = Checkpointer(str(d), async_=async_)
  c.save(1, _state(seed=1), {'pos': 1})
  c.wait()
  undo = _break_writes(d)
  try:
    # Raised by save itself: directories are made in the foreground.
    with pytest.raises(CheckpointSaveError, match='step 2.*untouched'):
      c.save(2, _state(seed=2), {'pos': 2})
  finally:
    undo()
  c.close()  # The error was reported once; closing does not hang.
  c = Checkpointer(str(d))
  assert c.all_steps() == [1]
  _, data, step = c.restore_latest(_abstract(_state()))
  assert (step, data) == (1, {'pos': 1})


def test_background_write_error_surfaces_on_the_next_call(
  tmp_path, monkeypatch
):
  """A write that fails in orbax's background threads is raised by the next
  save (or wait/close), not lost."""
  c = Checkpointer(str(tmp_path))
  c.save(1, _state(seed=1), {'pos': 1})
  c.wait()

  async def fail(self, x, directory):
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(ocp.JsonCheckpointHandler, '_save_fn', fail)
  c.save(2, _state(seed=2), {'pos': 2})  # Returns; the write fails later.
  with pytest.raises(CheckpointSaveError, match='step 2.*No space left'):
    c.save(3, _state(seed=3), {'pos': 3})
  monkeypatch.undo()
  c.close()
  c = Checkpointer(str(tmp_path))
  assert c.all_steps() == [1]
  _, data, step = c.restore_latest(_abstract(_state()))
  assert (step, data) == (1, {'pos': 1})


def test_old_format_checkpoint_restores(tmp_path):
  """Checkpoints written before the full manifest (StandardSave, params
  shapes only) still restore, including across an EMA switch."""
  saved = _state(seed=4)
  with ocp.CheckpointManager(
    tmp_path, item_names=('state', 'data', 'meta')
  ) as m:
    m.save(
      4,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(saved),
        data=ocp.args.JsonSave({'pos': 4}),
        meta=ocp.args.JsonSave(
          {'step': 4, 'shapes': ckpt_lib.shape_manifest(saved.params)}
        ),
      ),
    )
  c = Checkpointer(str(tmp_path))
  state, data, step = c.restore_latest(_abstract(saved))
  assert (step, data) == (4, {'pos': 4}) and _equal(state, saved)
  state, _, _ = c.restore_latest(_abstract(_state(ema=True)))
  assert _equal(state.ema_params, saved.params)
  with pytest.raises(IncompatibleCheckpointError, match='shapes differ'):
    c.restore_latest(_abstract(_state(width=8)))
  assert _listing(tmp_path) == ['4']
  c.close()
