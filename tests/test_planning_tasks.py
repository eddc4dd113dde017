"""Tests for the planning tasks of the planner/executor pipelines.

Each generator is checked against its own independent verifier (which can
fail: corrupted answers and plans are caught), Sudoku uniqueness against an
exhaustive count, seeds and disjoint splits, the arithmetic task against
reasoning.py, bad input, every planner sampler on every task, and the four
pipelines end to end.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from ddlm_jax.data import countdown, paths, sudoku
from ddlm_jax.data import planning_tasks as pt
from ddlm_jax.data import reasoning as rs
from ddlm_jax.evaluation.cost import transformer_flops
from ddlm_jax.planning import conditional, layout, pipelines
from ddlm_jax.planning import models as pm
from ddlm_jax.sampling.registry import get_sampler, parse_spec
from ddlm_jax.tasks import planner as planner_task
from experiments.configs import planner_executor as pe_config

NEW = ('sudoku4', 'countdown', 'paths')
N = 12  # problems per level


@pytest.fixture(scope='module')
def splits():
  out = {}
  for name in NEW:
    task = pt.get_task(name)
    out[name] = {
      s: task.make_split(s, task.levels, N, seed=0, plan_len=task.plan_len)
      for s in ('train', 'test')
    }
  return out


@pytest.mark.parametrize('name', NEW)
def test_generated_answers_and_plans_pass_the_verifiers(name, splits):
  task = pt.get_task(name)
  data = splits[name]['test']
  assert data['question'].shape == (N * len(task.levels), task.question_len)
  assert task.check_answers(data['question'], data['answer']).all()
  assert task.plan_correct(data['question'], data['plan']).all()
  np.testing.assert_array_equal(
    data['level'], np.repeat(np.asarray(task.levels), N)
  )
  for v in task.levels:  # the plan has the level's length, then PAD
    sel = data['level'] == v
    used = (data['plan'][sel] != task.pad_id).sum(1)
    np.testing.assert_array_equal(used, task.plan_tokens_needed(v))


def _other_answers(name, answer):
  """A different answer token of the same kind for every problem."""
  if name == 'sudoku4':
    ids = np.asarray(sudoku.DIGIT_IDS)
  elif name == 'countdown':
    ids = np.asarray(countdown.OP_IDS)
  else:
    ids = np.arange(paths.NODES)
  pos = np.searchsorted(ids, answer)
  return ids[(pos + 1) % len(ids)]


def _corrupt_plan(name, data):
  plan = data['plan'].copy()
  if name == 'sudoku4':
    # Swap two different values of the first row: rows stay permutations,
    # but a column or box breaks (or a given is overwritten).
    plan[:, [0, 1]] = plan[:, [1, 0]]
  elif name == 'countdown':
    plan[:, 4] = plan[:, 4] % countdown.MAX_VALUE + 1  # first step's result
  else:
    plan[:, 0] = (plan[:, 0] + 1) % paths.NODES  # not the source any more
  return plan


@pytest.mark.parametrize('name', NEW)
def test_corrupted_answers_and_plans_fail(name, splits):
  task = pt.get_task(name)
  data = splits[name]['test']
  wrong = _other_answers(name, data['answer'])
  assert not np.any(wrong == data['answer'])
  assert not task.check_answers(data['question'], wrong).any()
  bad = _corrupt_plan(name, data)
  assert not task.plan_correct(data['question'], bad).any()
  # A valid plan followed by junk, or cut short, is not a plan either.
  junk = data['plan'].copy()
  junk = np.concatenate([junk, np.zeros((len(junk), 1), np.int32)], 1)
  assert not task.plan_correct(data['question'], junk).any()
  assert not task.plan_correct(data['question'], data['plan'][:, :1]).any()


def test_sudoku_solutions_are_unique_and_solver_counts_exactly():
  # Closed form: there are 288 4x4 Sudoku grids; the table and the
  # verifier's depth-first search agree without sharing code.
  table = sudoku.all_grids()
  assert len(table) == 288 == len({tuple(g) for g in table})
  assert len(sudoku.solutions([0] * 16, limit=1000)) == 288
  data = sudoku.generate(30, 5, np.random.default_rng(1), 16)
  for q, p in zip(data['question'], data['plan']):
    found = sudoku.solutions([sudoku._digit(t) for t in q], limit=3)
    assert len(found) == 1
    assert list(found[0]) == [sudoku.DIGIT_IDS.index(t) + 1 for t in p]
    assert np.sum(q != sudoku.BLANK_ID) - 1 == 16 - sudoku.BLANKS[5]
  # Removing a given of a minimal (4-given) puzzle makes it ambiguous.
  q = data['question'][0].copy()
  q[np.flatnonzero(np.isin(q, sudoku.DIGIT_IDS))[0]] = sudoku.BLANK_ID
  assert sudoku.count_solutions(q, limit=3) >= 2
  assert not sudoku.check_answers(q[None], data['answer'][:1]).any()


def test_paths_and_countdown_verifiers_on_hand_made_problems():
  # Square 0-1-3, 0-2-3: two shortest paths, so no unique first hop.
  e = [0, 1, 1, 3, 0, 2, 2, 3] + [4, 5] * 6
  q = np.asarray(e + [paths.COLON_ID, 0, 3], np.int32)
  assert len(paths.shortest_paths(q, 5)) == 2
  assert not paths.check_answers(q[None], [1]).any()
  q[4:8] = [4, 6, 6, 7]  # drop 0-2-3: the unique path is 0 1 3
  assert paths.check_answers(q[None], [1]).all()
  plan = np.full((1, paths.PLAN_LEN), paths.PAD_ID, np.int32)
  plan[0, :3] = [0, 1, 3]
  assert paths.plan_correct(q[None], plan).all()
  # Countdown: 2 3 -> 6 only as 2 * 3; 2 2 -> 4 as 2 + 2 and 2 * 2.
  pad = countdown.PAD_ID
  q = np.asarray([[2, 3, pad, pad, countdown.COLON_ID, 6]], np.int32)
  assert countdown.solutions(q[0]) == {'(2*3)'}
  assert countdown.check_answers(q, [countdown.TOKEN_ID['*']]).all()
  assert not countdown.check_answers(q, [countdown.TOKEN_ID['+']]).any()
  q2 = np.asarray([[2, 2, pad, pad, countdown.COLON_ID, 4]], np.int32)
  assert len(countdown.solutions(q2[0])) == 2
  assert not countdown.check_answers(q2, [countdown.TOKEN_ID['*']]).any()
  tid = countdown.TOKEN_ID
  step = [3, tid['*'], 2, tid['='], 6, tid[';']]
  plan = np.asarray([step + [pad] * 12], np.int32)
  assert countdown.plan_correct(q, plan).all()
  plan[0, 0] = 4  # 4 is not one of the numbers
  assert not countdown.plan_correct(q, plan).any()


@pytest.mark.parametrize('name', NEW)
def test_deterministic_by_seed_and_splits_are_disjoint(name, splits):
  task = pt.get_task(name)
  a = task.make_split('test', task.levels, N, seed=0, plan_len=task.plan_len)
  b = task.make_split('test', task.levels, N, seed=1, plan_len=task.plan_len)
  for k in a:
    np.testing.assert_array_equal(a[k], splits[name]['test'][k])
  assert not np.array_equal(a['question'], b['question'])
  stream = task.stream_batches(
    16, task.train_levels, seed=0, plan_len=task.plan_len, start=3
  )
  s1, s2 = (
    next(stream),
    next(
      task.stream_batches(
        16, task.train_levels, seed=0, plan_len=task.plan_len, start=3
      )  # fmt: skip
    ),
  )
  for k in s1:
    np.testing.assert_array_equal(s1[k], s2[k])
  assert set(np.unique(s1['level'])) <= set(task.train_levels)
  keys = {
    s: {task.canonical(q) for q in splits[name][s]['question']}
    for s in ('train', 'test')
  }
  keys['stream'] = {task.canonical(q) for q in s1['question']}
  shared = {None}  # countdown's one-operation facts, in every split
  assert keys['test'] - shared
  assert not (keys['train'] & keys['test']) - shared
  assert not (keys['stream'] & keys['test']) - shared
  assert all(pt.split_of(k) == 'test' for k in keys['test'] - shared)


def test_countdown_facts_are_in_every_split_and_plans_are_split():
  """Level 1 (one operation) is the fact table: every split draws from all
  of it; levels 2 and 3 stay disjoint by problem."""
  task = pt.get_task('countdown')

  def problems(split, level, num):
    data = task.make_split(split, (level,), num, seed=0, plan_len=18)
    q = data['question']
    return {(*sorted(q_row[:-2]), q_row[-1]) for q_row in q.tolist()}

  facts = {s: problems(s, 1, 3000) for s in ('train', 'test')}
  assert facts['train'] == facts['test']  # all 117 facts, in both
  assert len(facts['test']) == 117
  for level in (2, 3):
    train, test = problems('train', level, 300), problems('test', level, 300)
    assert len(test) > 30 and not train & test


def test_arithmetic_task_arrays_are_the_recorded_ones():
  """The arithmetic task's split and stream are the arrays reasoning.py
  produced before the registry took them over (sha256 recorded then; numpy's
  PCG64 streams are the same on every platform), so the planner tables of
  docs/RESULTS.md section 8 stay reproducible."""
  task = pt.get_task('arithmetic')
  a = task.make_split('test', rs.LEVELS, 20, seed=3, plan_len=12)
  s = next(task.stream_batches(16, (1, 2), seed=0, plan_len=4, start=5))
  h = hashlib.sha256()
  for d in (a, s):
    for k in sorted(d):
      h.update(k.encode())
      h.update(np.ascontiguousarray(d[k], np.int64).tobytes())
  assert h.hexdigest() == (
    '4fb32373f7460b68d59f39abba017f2b65ce97aa880166206cb7ded43db2b3b2'
  )


def test_bad_input_raises_before_training():
  with pytest.raises(ValueError, match='unknown task'):
    pt.get_task('sudoku9')
  with pytest.raises(ValueError, match='unknown task'):
    pe_config.get_config('latent,sudoku9,cpu')
  with pytest.raises(ValueError, match='plan_len'):
    pt.get_task('countdown').make_split('test', (3,), 2, seed=0, plan_len=12)
  config = pe_config.get_config('text,countdown,smoke')
  config.reasoning.plan_len = 12
  with pytest.raises(ValueError, match='plan_len'):
    planner_task.check_config(config)
  config = pe_config.get_config('text,paths,smoke')
  config.reasoning.heldout_level = 4
  with pytest.raises(ValueError, match='heldout_level'):
    planner_task.check_config(config)
  config = pe_config.get_config('text,smoke')
  config.task = 'nope'
  with pytest.raises(ValueError, match='config.task'):
    planner_task.check_config(config)
  config.task = 'countdown'  # arithmetic levels 1-5 do not exist there
  with pytest.raises(ValueError, match='levels'):
    planner_task.check_config(config)
  with pytest.raises(ValueError, match='plan_len'):
    pipelines.PipelineSpec('direct', 4, task='countdown')


TINY = ml_collections.ConfigDict(dict(width=16, depth=1, num_heads=2))
SAMPLERS = (
  'confidence:greedy=True,num_steps=4',
  'eb:greedy=True',
  'first_hitting:greedy=True',
)


def _tiny_models(task):
  planner = pm.build(
    pm.backbone_config(TINY, causal=False, vocab_size=task.vocab_size), 0
  )
  executor = pm.build(
    pm.backbone_config(TINY, causal=True, vocab_size=task.vocab_size), 1
  )
  proj = pm.Projector(16, 16, num_layers=1, rngs=pm.nnx.Rngs(3))
  gd, params = {}, {}
  for name, mod in (('planner', planner), ('executor', executor),
                    ('projector', proj)):  # fmt: skip
    gd[name], params[name] = pm.split(mod)
  return gd, params


# One task stays in the fast suite; the others compile the same programs
# at other shapes (about 12 s of CPU each).
@pytest.mark.parametrize(
  'name',
  ['sudoku4']
  + [pytest.param(n, marks=pytest.mark.slow) for n in ('countdown', 'paths')],
)
def test_every_pipeline_and_planner_sampler_runs_on_the_task(name, splits):
  task = pt.get_task(name)
  q = jnp.asarray(splits[name]['test']['question'][:: 2 * N])
  gd, params = _tiny_models(task)
  process = pipelines.planner_process(task=name)
  apply = lambda z, t: pm.merge(gd['planner'], params['planner'])(z)
  for spec in SAMPLERS:
    sampler_name, sampler_params = parse_spec(spec)
    sampler = get_sampler(sampler_name, **sampler_params)
    plan, nfe, z = jax.jit(
      lambda k, q, sampler=sampler: conditional.sample_plan(
        sampler, apply, k, process, q, task.plan_len
      ),
      compiler_options=pipelines.FAST_COMPILE,
    )(jax.random.key(0), q)
    assert plan.shape == (len(q), task.plan_len)
    assert not np.any(np.asarray(plan) == process.mask_id), spec
    np.testing.assert_array_equal(z[:, : task.question_len], q)
  sampler = get_sampler('confidence', greedy=True, num_steps=2)
  for pipe in pipelines.PIPELINES:
    spec = pipelines.PipelineSpec(pipe, task.plan_len, sampler, task=name)
    out = pipelines.make_runner(spec, gd, fast_compile=True)(
      params, jax.random.key(1), q
    )
    assert out['answer_B'].shape == (len(q),)
    assert int(out['exec_nfe']) == (task.plan_len + 2 if pipe == 'cot' else 1)
  cfgs = {'planner': _cfg(task, False), 'executor': _cfg(task, True)}
  flops = pipelines.pipeline_flops(spec, cfgs, 3, 1)
  plan_call = transformer_flops(
    cfgs['planner'], 1, task.question_len + task.plan_len
  )
  assert flops['planner_flops'] == pytest.approx(3 * plan_call)
  assert layout.executor_length(task.plan_len, name) == (
    task.question_len + task.plan_len + 3
  )


def _cfg(task, causal):
  return pm.backbone_config(TINY, causal=causal, vocab_size=task.vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize('name', NEW)
def test_smoke_presets_of_every_pipeline_run_on_the_task(name, tmp_path):
  """The four smoke presets through the trainer on Sudoku; on the other
  tasks the latent preset alone, which trains all three stages (planner,
  executor, projector) on the task's data. Every pipeline runs on every
  task in the test above, with untrained models."""
  models = str(tmp_path / 'models')
  pipes = pipelines.PIPELINES if name == 'sudoku4' else ('latent',)
  for pipe in pipes:
    config = pe_config.get_config(f'{pipe},{name},smoke')
    config.models_dir = models
    out = planner_task.run_planner_executor(config, str(tmp_path / pipe))
    task = pt.get_task(name)
    assert out['task'] == name
    assert set(out['per_level']) == {str(v) for v in task.levels}
    assert 0.0 <= out['accuracy'] <= 1.0
    if pipe == 'cot':
      assert out['exec_nfe'] == task.plan_len + 2
