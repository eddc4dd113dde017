"""The group-representation diagnostic of PD-SSM token maps.

Hand-built maps: the regular representation of S3 and A5 (built from
explicit permutation tuples, not from the module under test) scores 1.0;
a relabelled copy on a larger state scores 1.0 on its orbit; random
functions score low; the loop writes the scores into metrics.jsonl.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from ddlm_jax.data import state_tracking as st
from ddlm_jax.evaluation import group_maps as gm
from ddlm_jax.tasks import state_tracking as st_task
from ddlm_jax.training import metrics
from experiments.configs import state_tracking as cfgs


def _s3_by_hand():
  """S3 as tuples and its table (apply a first), independent of st."""
  elems = list(itertools.permutations(range(3)))
  index = {p: k for k, p in enumerate(elems)}
  table = np.array(
    [[index[tuple(b[a[i]] for i in range(3))] for b in elems] for a in elems]
  )
  return elems, table


def _regular(table):
  # Right action x -> x * a: maps[a, x] = table[x, a].
  g = len(table)
  return np.array([[table[x, a] for x in range(g)] for a in range(g)])


def test_hand_built_table_matches_the_data_module():
  _, table = _s3_by_hand()
  np.testing.assert_array_equal(table, st.group_table('S3'))


@pytest.mark.parametrize('group', ['S3', 'A5'])
def test_regular_representation_scores_one(group):
  table = np.asarray(st.group_table(group))
  maps = _regular(table)
  np.testing.assert_array_equal(maps, gm.regular_representation(table))
  res = gm.group_map_scores(maps, table, start=(st.group_identity(group),))
  assert res == {
    'bijective_frac': 1.0,
    'homomorphism_frac': 1.0,
    'orbit_size': len(table),
    'distinct_maps': len(table),
    'distinct_elements': len(table),
    'block_size': len(table),
    'block_homomorphism_frac': 1.0,
    'block_distinct_maps': len(table),
    'block_distinct_elements': len(table),
  }


def test_embedded_representation_scores_one_on_its_orbit():
  # S3 on states 3..8 of N = 12; the other states do anything at all.
  _, table = _s3_by_hand()
  rng = np.random.default_rng(0)
  reg = _regular(table)
  maps = rng.integers(0, 12, size=(6, 12))
  maps[:, 3:9] = reg + 3
  res = gm.group_map_scores(maps, table, start=(3,))
  assert res['orbit_size'] == 6
  assert res['bijective_frac'] == res['homomorphism_frac'] == 1.0
  # Started everywhere, the junk states join the orbit and break it.
  res_all = gm.group_map_scores(maps, table, start=range(12))
  assert res_all['homomorphism_frac'] < 1.0


def test_a_representation_off_the_orbit_of_h0_is_found_in_a_block():
  # S3 permuting states 2, 4, 5 as it permutes the points 0, 1, 2 (the
  # natural action, faithful), while every map fixes 0 and swaps 1 and 3
  # by the sign: the orbit of e_0 is {0}, where only the identity acts.
  elems, table = _s3_by_hand()
  pts = np.array([2, 4, 5])
  maps = np.tile(np.arange(6), (6, 1))
  for a, p in enumerate(elems):
    maps[a, pts] = pts[list(p)]
    inversions = sum(p[i] > p[j] for i in range(3) for j in range(i + 1, 3))
    if inversions % 2:
      maps[a, [1, 3]] = [3, 1]
  res = gm.group_map_scores(maps, table)
  assert res['orbit_size'] == 1 and res['distinct_maps'] == 1
  assert res['block_size'] == 3
  assert res['block_homomorphism_frac'] == 1.0
  assert res['block_distinct_maps'] == res['block_distinct_elements'] == 6
  # A block whose maps are not all bijections does not count.
  maps[0, 2] = 4
  res = gm.group_map_scores(maps, table)
  assert res['block_size'] == 2 and res['block_distinct_maps'] == 2
  # (The sign block {1, 3}: a homomorphism onto C2, not faithful.)
  assert res['block_homomorphism_frac'] == 1.0
  assert res['block_distinct_elements'] == 2


def test_random_functions_score_low():
  _, table = _s3_by_hand()
  rng = np.random.default_rng(1)
  scores = [
    gm.group_map_scores(rng.integers(0, 16, (6, 16)), table) for _ in range(20)
  ]
  assert np.mean([s['homomorphism_frac'] for s in scores]) < 0.1
  assert np.mean([s['bijective_frac'] for s in scores]) < 0.2


def test_the_trivial_representation_is_a_homomorphism_but_not_faithful():
  _, table = _s3_by_hand()
  maps = np.tile(np.arange(5), (6, 1))
  res = gm.group_map_scores(maps, table)
  assert res['homomorphism_frac'] == res['bijective_frac'] == 1.0
  assert res['distinct_maps'] == 1 and res['orbit_size'] == 1


def test_a_wrong_but_bijective_representation_is_caught():
  # Every token the same 3-cycle: all bijections, few relations hold.
  _, table = _s3_by_hand()
  maps = np.tile(np.array([1, 2, 0]), (6, 1))
  res = gm.group_map_scores(maps, table)
  assert res['bijective_frac'] == 1.0
  # map(a) then map(b) = the cycle squared, never the cycle itself.
  assert res['homomorphism_frac'] == 0.0


def test_generator_scores():
  table = np.asarray(st.group_table('A5'))
  gens = st.group_generators('A5', 3, 0)
  reg = _regular(table)
  res = gm.generator_map_scores(reg[gens], gens, table, 0)
  assert res == {
    'bijective_frac': 1.0,
    'homomorphism_frac': 1.0,
    'orbit_size': 60,
    'distinct_maps': 3,
    'distinct_elements': 60,
    'block_size': 60,
    'block_homomorphism_frac': 1.0,
    'block_distinct_maps': 3,
    'block_distinct_elements': 60,
  }
  rng = np.random.default_rng(2)
  bad = gm.generator_map_scores(rng.integers(0, 64, (3, 64)), gens, table, 0)
  assert bad['homomorphism_frac'] < 0.2


def test_bad_maps_are_refused():
  _, table = _s3_by_hand()
  with pytest.raises(ValueError, match='integer'):
    gm.group_map_scores(np.zeros((6, 4)), table)
  with pytest.raises(ValueError, match=r'\(6, 6\)'):
    gm.group_map_scores(np.zeros((5, 4), int), table)


def test_the_loop_records_the_diagnostic(tmp_path):
  c = cfgs.get_config('pdssm,s3,smoke')
  c.model.num_layers = 1
  c.model.d_model = c.model.state_size = 8
  c.model.scan_impl = 'reference'
  out = str(tmp_path / 'run')
  st_task.train_state_tracking(c, out)
  val = [r for r in metrics.read_metrics(out) if r['split'] == 'validation']
  assert [r['step'] for r in val] == [2, 4]
  for r in val:
    assert 0 <= r['bijective_frac'] <= 1 and 0 <= r['homomorphism_frac'] <= 1
    assert 1 <= r['orbit_size'] <= 8
  # The record is what the pure function says of the run's first layer.
  state = st_task.restore_state(c, out)
  diagnose = st_task.group_diagnostic(c)
  assert diagnose(state.params)['bijective_frac'] == val[-1]['bijective_frac']
  # Not a PD-SSM on a group: nothing to diagnose.
  assert st_task.group_diagnostic(cfgs.get_config('pdssm,parity,smoke')) is None
  assert st_task.group_diagnostic(cfgs.get_config('lstm,s3,smoke')) is None


@pytest.mark.parametrize('task', ['s3', 'a4', 'a4_gen'])
def test_faithful_relations_need_every_element_distinct(task, monkeypatch):
  # The regular representation scores 1. The action on the cosets of a
  # normal subgroup (S3 on S3 / A3, A4 on A4 / V4) keeps every relation
  # but is not faithful, and scores 0. For a4_gen the tokens are two
  # generators, so faithfulness counts the elements' maps, not the tokens'.
  c = cfgs.get_config(f'pdssm,{task},groups')
  spec = st.task_spec(task)
  table = np.asarray(st.group_table(spec.group))
  gens = st.task_generators(task)
  reg = _regular(table)[gens]
  graphdef, init, _ = st_task.programs(st_task.classifier_config(c), False)
  params = init(jax.random.key(0))
  diagnose = st_task.group_diagnostic(c)
  monkeypatch.setattr(st_task, 'token_maps', lambda model: reg)
  res = diagnose(params)
  assert res['faithful_relations'] == 1.0
  assert res['block_distinct_elements'] == len(table)
  # States beyond the number of cosets stay fixed.
  orders = (3,) if task == 's3' else (2,)
  e = st.group_identity(spec.group)
  normal = [g for g in range(len(table)) if _order(table, g, e) in (1, *orders)]
  assert len(normal) == (3 if task == 's3' else 4)  # A3 in S3, V4 in A4.
  cosets = _cosets(table, normal)
  assert len(cosets) == (2 if task == 's3' else 3)
  n = len(table)
  quot = np.tile(np.arange(n), (len(gens), 1))
  for k, g in enumerate(gens):
    for i, coset in enumerate(cosets):
      quot[k, i] = _coset_of(cosets, int(table[coset[0], g]))
  monkeypatch.setattr(st_task, 'token_maps', lambda model: quot)
  res = diagnose(params)
  assert res['block_homomorphism_frac'] == 1.0
  assert res['faithful_relations'] == 0.0


def _order(table, g, identity):
  x, k = g, 1
  while x != identity:
    x, k = int(table[x, g]), k + 1
  return k


def _cosets(table, normal):
  """Cosets of the normal subgroup with those element indices."""
  cosets, seen = [], set()
  for g in range(len(table)):
    if g in seen:
      continue
    coset = sorted({int(table[h, g]) for h in normal})
    seen.update(coset)
    cosets.append(coset)
  return cosets


def _coset_of(cosets, g):
  return next(i for i, c in enumerate(cosets) if g in c)
