"""Tests for ddlm_jax.data.state_tracking against independent evaluators.

Each task's labels are recomputed here by a different method than the
generator's vectorised numpy code: Python sums and walks, Python ``eval`` for
modular arithmetic, and explicit tuple composition for the group words.
"""

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from ddlm_jax.data import state_tracking as st

# ----------------------------------------------------------------------------
# Independent evaluators (plain Python on one sequence at a time).


def _real(tokens, length):
  return [int(t) for t in tokens[:length]]


def eval_parity(seq):
  return sum(1 for t in seq if t == 2) % 2


def eval_even_pairs(seq):
  return int(seq[0] == seq[-1])


def eval_cycle(seq):
  pos = 0
  for t in seq:
    if t == 2:
      pos = pos + 1 if pos < 4 else 0
    elif t == 3:
      pos = pos - 1 if pos > 0 else 4
  return pos


def eval_mod_arith(seq):
  symbols = {1: '0', 2: '1', 3: '2', 4: '3', 5: '4', 6: '+', 7: '-', 8: '*'}
  expr = ''.join(symbols[t] for t in seq)
  return eval(expr) % 5  # Python precedence: * before + and -.


def _cycle_count(p):
  seen, cycles = set(), 0
  for start in range(len(p)):
    if start not in seen:
      cycles += 1
      j = start
      while j not in seen:
        seen.add(j)
        j = p[j]
  return cycles


def _elements(group):
  perms = sorted(itertools.permutations(range(5)))
  if group == 'S5':
    return perms
  # Even <=> n - #cycles is even.
  return [p for p in perms if (5 - _cycle_count(p)) % 2 == 0]


def _then(p, q):
  """Apply p first, then q: i -> q[p[i]] (explicit tuples)."""
  return tuple(q[p[i]] for i in range(5))


def eval_group(seq, group, gens):
  elems = _elements(group)
  word = [elems[gens[t - 1]] for t in seq]
  prod = functools.reduce(_then, word, tuple(range(5)))
  return elems.index(prod)


EVALUATORS = {
  'parity': eval_parity,
  'even_pairs': eval_even_pairs,
  'cycle_nav': eval_cycle,
  'mod_arith': eval_mod_arith,
}


def _check_labels(task, data, num_generators=None):
  spec = st.TASKS[task]
  if spec.group is not None:
    gens = list(st.group_generators(spec.group, num_generators))
    fn = functools.partial(eval_group, group=spec.group, gens=gens)
  else:
    fn = EVALUATORS[task]
  expected = [fn(_real(t, n)) for t, n in zip(data['tokens'], data['lengths'])]
  np.testing.assert_array_equal(data['labels'], np.array(expected))


# ----------------------------------------------------------------------------


@pytest.mark.parametrize('task', sorted(st.TASKS))
@pytest.mark.parametrize('split', ['train', 'test'])
def test_labels_match_independent_evaluator(task, split):
  num = 150 if st.TASKS[task].group else 300
  data = st.make_split(task, split, num, seed=3)
  _check_labels(task, data)


@pytest.mark.parametrize('task', ['a5', 's5'])
def test_group_with_random_generators(task):
  data = st.make_split(task, 'train', 200, seed=1, num_generators=4)
  vocab, classes = st.task_info(task, num_generators=4)
  assert vocab == 5 and classes == (60 if task == 'a5' else 120)
  assert data['tokens'].max() == 4
  _check_labels(task, data, num_generators=4)
  # The generator set is shared by every split (depends on generator_seed).
  gens = st.group_generators(st.TASKS[task].group, 4)
  assert len(set(gens.tolist())) == 4 and st.group_identity('A5') not in gens
  other = st.group_generators(st.TASKS[task].group, 4, generator_seed=7)
  assert not np.array_equal(gens, other)


def test_group_elements_and_convention():
  for group, size in (('A5', 60), ('S5', 120)):
    elems = st.group_elements(group)
    assert elems.shape == (size, 5)
    assert [tuple(p) for p in elems] == _elements(group)
  # Left-to-right product: (g * h)[i] = h[g[i]]; g, h do not commute.
  elems = _elements('S5')
  g, h = (1, 0, 2, 3, 4), (0, 2, 1, 3, 4)
  gi, hi = elems.index(g), elems.index(h)
  table = st.group_table('S5')
  assert table[gi, hi] == elems.index((2, 0, 1, 3, 4))
  assert table[gi, hi] != table[hi, gi]
  # Identity is index 0; A5 is closed under the product.
  assert st.group_identity('S5') == 0 and st.group_identity('A5') == 0
  a5 = st.group_table('A5')
  assert a5.min() == 0 and a5.max() == 59
  assert all(sorted(row) == list(range(60)) for row in a5)  # Latin square


def test_mod_arith_hand_examples():
  # 3 + 4 x 2 - 1 = 10 = 0 (mod 5); 2 - 4 x 4 = -14 = 1 (mod 5).
  ids = {'0': 1, '1': 2, '2': 3, '3': 4, '4': 5, '+': 6, '-': 7, 'x': 8}
  for expr, value in (('3+4x2-1', 0), ('2-4x4', 1), ('4x4x4', 4), ('1', 1)):
    toks = np.array([[ids[c] for c in expr]])
    got = st._labels_mod_arith(toks, np.array([len(expr)]))
    assert got[0] == value, expr


@pytest.mark.parametrize('task', sorted(st.TASKS))
def test_layout_padding_and_lengths(task):
  data = st.make_split(task, 'train', 400, seed=0, min_len=5, max_len=17)
  vocab, classes = st.task_info(task)
  toks, lens, labels = data['tokens'], data['lengths'], data['labels']
  assert toks.dtype == lens.dtype == labels.dtype == np.int32
  assert toks.shape == (400, 17)
  assert lens.min() >= 5 and lens.max() <= 17
  mask = np.arange(17)[None] < lens[:, None]
  assert (toks[~mask] == st.PAD_ID).all()
  assert toks[mask].min() >= 1 and toks[mask].max() <= vocab - 1
  assert labels.min() >= 0 and labels.max() < classes
  if task == 'mod_arith':
    assert (lens % 2 == 1).all()
    assert set(np.unique(lens)) == {5, 7, 9, 11, 13, 15, 17}
    nums = toks[:, ::2][mask[:, ::2]]
    ops = toks[:, 1::2][mask[:, 1::2]]
    assert nums.max() <= 5 and ops.min() >= 6
  else:
    assert set(np.unique(lens)) == set(range(5, 18))


def test_default_lengths_per_split():
  train = st.make_split('parity', 'train', 2000, seed=0)
  test = st.make_split('parity', 'test', 2000, seed=0)
  assert train['tokens'].shape[1] == 40 and test['tokens'].shape[1] == 256
  assert train['lengths'].min() == 3 and train['lengths'].max() == 40
  assert test['lengths'].min() >= 40 and test['lengths'].max() == 256
  # Labels are roughly balanced (a broken generator would be constant).
  assert 0.4 < train['labels'].mean() < 0.6


@settings(max_examples=10, deadline=None)
@given(task=st_.sampled_from(sorted(st.TASKS)), seed=st_.integers(0, 2**31 - 1))
def test_determinism_per_seed_and_split(task, seed):
  a = st.make_split(task, 'validation', 20, seed=seed)
  b = st.make_split(task, 'validation', 20, seed=seed)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  c = st.make_split(task, 'test', 20, seed=seed)
  d = st.make_split(task, 'validation', 20, seed=seed + 1)
  assert not np.array_equal(a['tokens'], c['tokens'])
  assert not np.array_equal(a['tokens'], d['tokens'])


def test_iterate_batches_covers_each_example_once():
  data = st.make_split('cycle_nav', 'train', 50, seed=0)
  batches = list(st.iterate_batches(data, 8, seed=1, num_epochs=2))
  assert len(batches) == 12 and all(len(b['labels']) == 8 for b in batches)
  key = lambda b: [tuple(t) for t in b['tokens']]
  first = sum((key(b) for b in batches[:6]), [])
  assert len(set(first)) == len(first)  # no repeats within an epoch
  again = list(st.iterate_batches(data, 8, seed=1, num_epochs=2))
  np.testing.assert_array_equal(batches[3]['tokens'], again[3]['tokens'])
  ordered = list(st.iterate_batches(data, 16, seed=None, drop_remainder=False))
  np.testing.assert_array_equal(
    np.concatenate([b['labels'] for b in ordered]), data['labels']
  )


def test_stream_batches_are_fresh_and_correct():
  stream = st.stream_batches('mod_arith', 32, seed=0, max_len=21)
  b1, b2 = next(stream), next(stream)
  assert b1['tokens'].shape == (32, 21)
  assert not np.array_equal(b1['tokens'], b2['tokens'])
  _check_labels('mod_arith', b2)


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match='unknown task'):
    st.make_split('dyck', 'train', 4, seed=0)
  with pytest.raises(ValueError, match='unknown split'):
    st.make_split('parity', 'dev', 4, seed=0)
  with pytest.raises(ValueError, match='min_len'):
    st.make_split('parity', 'train', 4, seed=0, min_len=9, max_len=3)
  with pytest.raises(ValueError, match='odd length'):
    st.make_split('mod_arith', 'train', 4, seed=0, min_len=8, max_len=8)
  with pytest.raises(ValueError, match='num_generators'):
    st.make_split('parity', 'train', 4, seed=0, num_generators=3)
  with pytest.raises(ValueError, match='num_generators'):
    st.task_info('a5', num_generators=60)
