"""Halt and resume reproduces an uninterrupted run, for every family/kind.

Each case trains its `:smoke` preset for 6 steps twice: straight through,
and halted after 3 steps (train.halt_after_steps) then started again on the
same workdir. The resumed run must match the uninterrupted one in its
final parameters (every leaf, bit for bit up to 1e-6 relative) and in its
metrics records (every train and validation value at every step both
logged; timing values excluded). The masked-diffusion family is covered by
tests/test_training.py; these are the families and kinds it leaves out,
with every stage of the planner/executor pipeline.
"""

import json
import os

import jax
import numpy as np
import pytest

from ddlm_jax.tasks import language_model as lm
from ddlm_jax.tasks import state_tracking as st_task
from experiments.configs import (
  ar_quickstart,
  bd3_quickstart,
  duo_quickstart,
  sm_scratch,
  state_tracking,
)
from experiments.configs.common import override

_TIMING = ('per_sec', 'seconds', 'wall')


def _records(workdir) -> dict:
  """{(split, step): {key: value}} without the timing values."""
  out = {}
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    for line in f:
      r = json.loads(line)
      out[(r.pop('split'), r.pop('step'))] = {
        k: v for k, v in r.items() if not any(t in k for t in _TIMING)
      }
  return out


def _same_records(got: dict, ref: dict):
  shared = sorted(set(got) & set(ref))
  # Every record of the uninterrupted run is there (the halt adds a log).
  assert set(ref) <= set(got), sorted(set(ref) - set(got))
  for key in shared:
    assert got[key].keys() == ref[key].keys(), key
    for name, value in ref[key].items():
      if not isinstance(value, (int, float, list)):
        assert got[key][name] == value, (key, name)
        continue
      np.testing.assert_allclose(
        got[key][name], value, rtol=1e-6, atol=1e-7, err_msg=f'{key} {name}'
      )


def _same_leaves(got, ref):
  flat_got = jax.tree_util.tree_leaves_with_path(got)
  flat_ref = jax.tree_util.tree_leaves_with_path(ref)
  assert [p for p, _ in flat_got] == [p for p, _ in flat_ref]
  for (path, a), (_, b) in zip(flat_got, flat_ref):
    np.testing.assert_allclose(
      np.asarray(a, np.float64),
      np.asarray(b, np.float64),
      rtol=1e-6,
      atol=1e-7,
      err_msg=jax.tree_util.keystr(path),
    )


def _lm(make, arg, **overrides):
  def config(**more):
    c = make.get_config(arg)
    c.mesh.shape = (1, 1, 1)
    c.train.num_steps = 6
    c.train.checkpoint_every = 2
    c.train.eval_every = 3
    c.sample.num_samples = 0
    c.eval.final_num_batches = 1
    return override(c, {**overrides, **more})

  return config


LM_CASES = {
  'interpolating': _lm(duo_quickstart, 'interpolating,smoke'),
  'bd3_mix_scale': _lm(
    bd3_quickstart, '16,smoke', **{'process.block_sizes': '4,8,16'}
  ),
  'soft_masking': _lm(sm_scratch, 'smoke'),
  'autoregressive': _lm(ar_quickstart, 'smoke'),
}


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(LM_CASES))
def test_lm_resume_reproduces_state_and_metrics(tmp_path, case):
  config = LM_CASES[case]
  full, part = str(tmp_path / 'full'), str(tmp_path / 'part')
  lm.train_and_evaluate(config(), full)
  halted = lm.train_and_evaluate(config(**{'train.halt_after_steps': 3}), part)
  assert halted['steps'] == 3
  resumed = lm.train_and_evaluate(config(), part)
  assert resumed['start_step'] == 3 and resumed['finished']
  _same_records(_records(part), _records(full))
  got, ref = lm.restore_state(part), lm.restore_state(full)
  _same_leaves(got.params, ref.params)
  _same_leaves(got.opt_state, ref.opt_state)


@pytest.mark.slow
def test_state_tracking_resume_reproduces_state_and_metrics(tmp_path):
  def config(halt=0):
    c = state_tracking.get_config('pdssm,parity,smoke')
    c.train.num_steps = 6
    # Train records are window means since the last log: halting on a log
    # step keeps the windows of both runs the same.
    c.train.log_every = 3
    c.train.halt_after_steps = halt
    return c

  full, part = str(tmp_path / 'full'), str(tmp_path / 'part')
  st_task.train_state_tracking(config(), full)
  st_task.train_state_tracking(config(halt=3), part)
  resumed = st_task.train_state_tracking(config(), part)
  assert resumed['start_step'] == 3 and resumed['finished']
  _same_records(_records(part), _records(full))
  got = st_task.restore_state(config(), part)
  ref = st_task.restore_state(config(), full)
  _same_leaves(got.params, ref.params)
  _same_leaves(got.extra, ref.extra)


@pytest.mark.slow
def test_planner_stages_resume_reproduce_state_and_metrics(tmp_path):
  """Every stage (planner, executor, projector) halts after 2 of its 3
  steps; four starts finish the pipeline as one uninterrupted start."""
  from ddlm_jax.tasks.planner import load_models, run_planner_executor
  from experiments.configs import planner_executor

  def config(halt=0):
    c = planner_executor.get_config('latent,smoke')
    c.train.halt_after_steps = halt
    return c

  full, part = tmp_path / 'full', tmp_path / 'part'
  ref = run_planner_executor(config(), str(full))
  stops = []
  for _ in range(6):
    got = run_planner_executor(config(halt=2), str(part))
    if 'stage' not in got:
      break
    stops.append((got['stage'], got['steps']))
  assert stops == [('planner', 2), ('text', 2), ('projector', 2)]
  for key, value in ref.items():
    timing = any(t in key for t in (*_TIMING, 'time')) or key.endswith('_s')
    if isinstance(value, float) and not timing:
      np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=key)
  stages = sorted(
    p.parent.relative_to(full) for p in full.rglob('metrics.jsonl')
  )
  assert len(stages) == 3, stages
  for stage in stages:
    _same_records(_records(part / stage), _records(full / stage))
  _, params_got = load_models(config(), str(part / 'models'))
  _, params_ref = load_models(config(), str(full / 'models'))
  _same_leaves(params_got, params_ref)
