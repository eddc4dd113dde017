"""Group word problems (S3, A5, S5 with k generators) and the authors' block.

Group arithmetic is checked by exact enumeration against an independent
composition of explicit permutation tuples; the PD-SSM column convention by
hand-set automata that merge states (which a row one-hot transition, the
layout of the authors' released code, provably cannot emulate, checked by
enumerating every row map); the authors' block by its structure.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.data import state_tracking as st
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.models import ssm

_CHEAP_XLA = {
  'xla_backend_optimization_level': 0,
  'xla_llvm_disable_expensive_passes': True,
}


def _jit(fn):
  """jax.jit for fn(module, *args) (split/merge), compiled cheaply."""

  @functools.partial(jax.jit, static_argnums=0, compiler_options=_CHEAP_XLA)
  def run(graphdef, state, *args):
    return fn(nnx.merge(graphdef, state), *args)

  def wrapped(module, *args):
    graphdef, state = nnx.split(module)
    return run(graphdef, state, *args)

  return wrapped


_states = _jit(lambda m, u: m.states(u)[0])
_apply = _jit(lambda m, x: m(x))


def _perms(n, even_only=False):
  out = []
  for p in itertools.permutations(range(n)):
    inversions = sum(p[i] > p[j] for i in range(n) for j in range(i + 1, n))
    if not even_only or inversions % 2 == 0:
      out.append(p)
  return sorted(out)


_GROUPS = {
  'S3': _perms(3),
  'A4': _perms(4, True),
  'A5': _perms(5, True),
  'S5': _perms(5),
}
# a4_gen's tokens: the 3-cycle 0 -> 1 -> 2 -> 0 and the double transposition
# (0 1)(2 3), as tuples of images.
_A4_GEN = [(1, 2, 0, 3), (1, 0, 3, 2)]


def _then(p, q):
  """Apply p first, then q (explicit tuples)."""
  return tuple(q[p[i]] for i in range(len(p)))


def _word_products(tokens, length, group, gens):
  elems = _GROUPS[group]
  prod = tuple(range(len(elems[0])))
  out = []
  for t in tokens[:length]:
    prod = _then(prod, elems[gens[t - 1]])
    out.append(elems.index(prod))
  return out


@pytest.mark.parametrize('group', sorted(_GROUPS))
def test_elements_table_and_closure_by_enumeration(group):
  elems = _GROUPS[group]
  assert [tuple(p) for p in st.group_elements(group)] == elems
  table = st.group_table(group)
  for a, b in itertools.product(range(len(elems)), repeat=2):
    if (a + 7 * b) % 5 == 0 or group == 'S3':  # A fifth of the big tables.
      assert table[a, b] == elems.index(_then(elems[a], elems[b]))
  # Closed (a Latin square over the group's own indices), identity at 0.
  assert all(sorted(row) == list(range(len(elems))) for row in table)
  assert st.group_identity(group) == 0
  assert len(st.generated_subgroup(group, range(len(elems)))) == len(elems)


def test_generated_subgroup_by_enumeration():
  s3 = _GROUPS['S3']
  r = s3.index((1, 2, 0))  # 3-cycle
  t = s3.index((1, 0, 2))  # transposition
  np.testing.assert_array_equal(st.generated_subgroup('S3', [r]), [0, 3, 4])
  assert len(st.generated_subgroup('S3', [t])) == 2
  assert len(st.generated_subgroup('S3', [r, t])) == 6
  # A 5-cycle generates C5 in A5; with a 3-cycle it generates all of A5.
  a5 = _GROUPS['A5']
  c5, c3 = a5.index((1, 2, 3, 4, 0)), a5.index((1, 2, 0, 3, 4))
  assert len(st.generated_subgroup('A5', [c5])) == 5
  assert len(st.generated_subgroup('A5', [c5, c3])) == 60


@pytest.mark.parametrize(
  'task, k',
  [
    ('s3', None),
    ('s3', 2),
    ('a4', None),
    ('a4_gen', None),
    ('a5', 2),
    ('a5', 8),
    ('s5', 4),
  ],
)
def test_labels_and_prefix_labels_equal_independent_products(task, k):
  group = st.task_spec(task).group
  data = st.make_split(
    task, 'train', 40, seed=5, num_generators=k, prefix_labels=True
  )
  gens = list(st.task_generators(task, k))
  if task == 'a4_gen':  # Its two fixed generators, in token order.
    assert [_GROUPS[group][g] for g in gens] == _A4_GEN
  elif k is None:
    assert len(gens) == len(_GROUPS[group])
  else:
    assert len(gens) == k
  # The token set generates the whole group, without the identity.
  assert len(st.generated_subgroup(group, gens)) == len(_GROUPS[group])
  if k is not None or task == 'a4_gen':
    assert 0 not in gens and len(set(gens)) == len(gens)
  for tok, n, lab, pre in zip(
    data['tokens'], data['lengths'], data['labels'], data['prefix_labels']
  ):
    want = _word_products(tok, n, group, gens)
    assert lab == want[-1]
    np.testing.assert_array_equal(pre[:n], want)
    assert (pre[n:] == 0).all() and (tok[n:] == st.PAD_ID).all()
  # prefix_labels is an extra array: the others are the same draw.
  plain = st.make_split(task, 'train', 40, seed=5, num_generators=k)
  for key, value in plain.items():
    np.testing.assert_array_equal(value, data[key])


def test_s3_info_and_stream():
  assert st.task_info('s3') == (7, 6)
  assert st.task_info('s3', num_generators=2) == (3, 6)
  batch = next(
    st.stream_batches('s3', 8, seed=0, num_generators=2, prefix_labels=True)
  )
  gens = list(st.group_generators('S3', 2))
  for tok, n, pre in zip(
    batch['tokens'], batch['lengths'], batch['prefix_labels']
  ):
    np.testing.assert_array_equal(pre[:n], _word_products(tok, n, 'S3', gens))
  assert 's3' not in st.TASKS  # The benchmark registry stays as it was.


def test_generator_sets_that_cannot_generate_raise():
  # One element generates a cyclic group, never all of S3.
  with pytest.raises(ValueError, match='num_generators'):
    st.group_generators('S3', 1)
  with pytest.raises(ValueError, match='prefix_labels'):
    st.make_split('parity', 'train', 4, seed=0, prefix_labels=True)
  with pytest.raises(ValueError, match='unknown group'):
    st.group_elements('A6')
  # a4_gen's generators are fixed: a random count is refused.
  with pytest.raises(ValueError, match='fixed generators'):
    st.make_split('a4_gen', 'train', 4, seed=0, num_generators=2)


def test_a4_info_and_elements():
  assert st.task_info('a4') == (13, 12)
  assert st.task_info('a4_gen') == (3, 12)
  elems = _GROUPS['A4']
  assert len(elems) == 12 and st.group_identity('A4') == 0
  # The two generators have orders 3 and 2 and generate all of A4 (a
  # 3-cycle with a double transposition), by explicit closure.
  closure, frontier = {elems[0]}, [elems[0]]
  while frontier:
    frontier = [
      _then(p, g)
      for p in frontier
      for g in _A4_GEN
      if _then(p, g) not in closure
    ]
    closure.update(frontier)
  assert closure == set(elems)
  gens = st.task_generators('a4_gen')
  assert len(st.generated_subgroup('A4', gens)) == 12
  assert 'a4' not in st.TASKS and 'a4_gen' not in st.TASKS


# ----------------------------------------------------------------------------
# Column one-hot (ours, the paper's math) vs row one-hot (the released code).


def _merge_automaton():
  """3 states; token 1 merges 1 into 0 (0->0, 1->0, 2->2), token 2 cycles."""
  return [(0, 0, 2), (1, 2, 0)]


def _row_layout_can_emulate(delta):
  """Is there a row map pi with (R e_s) proportional to e_{delta(s)} for all s?

  Row one-hot R[m, pi(m)] = d_m (the released code's D P): column s of R is
  sum over {m: pi(m) = s} of d_m e_m, so every column must hold exactly the
  one row delta(s). Enumerates all N^N row maps (diagonal scales cannot
  create or remove a non-zero column entry, only d_m = 0 removes it, which
  is covered by trying every subset of zeroed rows).
  """
  n = len(delta)
  for pi in itertools.product(range(n), repeat=n):
    for alive in itertools.product((0, 1), repeat=n):
      cols = [
        {m for m in range(n) if pi[m] == s and alive[m]} for s in range(n)
      ]
      if all(cols[s] == {delta[s]} for s in range(n)):
        return True
  return False


def test_row_layout_cannot_merge_but_permutes():
  merge, cycle = _merge_automaton()
  assert not _row_layout_can_emulate(merge)
  assert _row_layout_can_emulate(cycle)  # permutations: pi = delta^-1


def _hand_set(perms, n_states):
  """PD-SSM (our column layout) whose token k+1 moves state j -> perms[k][j].

  Token K+1 is a BOS that writes e_0 through B; u is one-hot, D = K + 2.
  """
  K = len(perms)
  D, N = K + 2, n_states
  mixer = ssm.SSMMixer(
    D, N, num_dict=K, gate_hidden=2, scan_impl='reference', rngs=nnx.Rngs(0)
  )
  sel = np.zeros((D, K), np.float32)
  sel[np.arange(1, K + 1), np.arange(K)] = 30.0
  mixer.select.kernel[...] = jnp.asarray(sel)
  mixer.select.bias[...] = jnp.zeros(K)
  dic = np.zeros((K, N, N), np.float32)
  for k, perm in enumerate(perms):
    dic[k, np.asarray(perm), np.arange(N)] = 1.0
  mixer.dictionary[...] = jnp.asarray(dic)
  for mlp, bias in ((mixer.mag_mlp, 12.0), (mixer.phase_mlp, -40.0)):
    mlp.fc2.kernel[...] = jnp.zeros_like(mlp.fc2.kernel[...])
    mlp.fc2.bias[...] = jnp.full((N,), bias)
  b_re = np.zeros((D, N), np.float32)
  b_re[K + 1, 0] = 1.0
  mixer.B_re[...] = jnp.asarray(b_re)
  mixer.B_im[...] = jnp.zeros((D, N))
  return mixer


def test_column_layout_emulates_a_merging_automaton():
  delta = _merge_automaton()
  mixer = _hand_set(delta, 3)
  rng = np.random.default_rng(0)
  toks = rng.integers(1, 3, size=(5, 30))
  states = np.zeros_like(toks)
  s = np.zeros(5, np.int64)
  for t in range(toks.shape[1]):
    s = np.array([delta[k - 1][v] for k, v in zip(toks[:, t], s)])
    states[:, t] = s
  bos = np.full((5, 1), 3)
  u = jax.nn.one_hot(jnp.asarray(np.concatenate([bos, toks], 1)), 4)
  h = np.abs(np.asarray(_states(mixer, u)))[:, 1:]
  # The merged state keeps ONE non-zero entry of size ~1 (mass adds up).
  assert (np.count_nonzero(h > 1e-6, axis=-1) == 1).all()
  np.testing.assert_array_equal(h.argmax(-1), states)
  assert h.max(-1).min() > 0.99
  # Dense check of the convention: A[:, j] = D[j] e_{P[j]}.
  p_idx = _jit(lambda m, v: m.transition_indices(v))(mixer, u[:1, 1:2])[0, 0]
  assert tuple(np.asarray(p_idx)) == delta[int(toks[0, 0]) - 1]


# ----------------------------------------------------------------------------
# The authors' block ('pdssm_paper') and per-position logits.


@functools.cache
def _paper_classifier(n=8, vocab=4, classes=6):
  cfg = sc.ClassifierConfig(
    vocab_size=vocab,
    num_classes=classes,
    mixer='pdssm_paper',
    d_model=n,
    state_size=n,
    num_dict=3,
    num_layers=1,
    scan_impl='reference',
  )
  return sc.SequenceClassifier(cfg, rngs=nnx.Rngs(0))


def test_paper_block_structure():
  model = _paper_classifier()
  block = model.blocks[0]
  assert isinstance(block, ssm.PostNormBlock)
  mixer = block.mixer
  assert mixer.init == 'authors' and mixer.initial_state == 'onehot'
  assert mixer.select.bias is None and mixer.readout_bias is not None
  assert mixer.mag_mlp.fc1.kernel[...].shape == (8, 16)  # hidden 2N
  names = {
    '/'.join(map(str, k)) for k, _ in nnx.to_flat_state(nnx.state(block))
  }
  assert not any(
    'mlp' in n and 'mag' not in n and 'phase' not in n for n in names
  )
  # Post-norm: each position's output has mean 0 and variance 1 (LayerNorm
  # at its init), whatever the input scale: no residual bypasses the norm.
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, 8)) * 30)
  y = np.asarray(_apply(block, x))
  np.testing.assert_allclose(y.mean(-1), 0, atol=1e-5)
  np.testing.assert_allclose(y.var(-1), 1, atol=1e-3)


def test_authors_init_scales_and_default_unchanged():
  n, d = 64, 64
  a = ssm.SSMMixer(d, n, init='authors', rngs=nnx.Rngs(0))
  b = ssm.SSMMixer(d, n, rngs=nnx.Rngs(0))
  # Monte Carlo std over 4096 draws: relative error ~ 1/sqrt(2 * 4096) =
  # 1.1%; 6% tolerance is > 5 sigma.
  for p, want in (
    (a.B_re, (2 * n) ** -0.5),
    (a.C_re, (6 * n) ** -0.5),
    (b.B_re, d**-0.5),
    (b.C_re, n**-0.5),
  ):
    np.testing.assert_allclose(np.asarray(p[...]).std(), want, rtol=0.06)
  assert b.readout_bias is None and b.select.bias is not None
  np.testing.assert_array_equal(np.asarray(b.d_skip[...]), 1.0)
  # D_skip ~ N(0, 1/D): 64 draws, std within 25% (> 2.8 sigma).
  np.testing.assert_allclose(
    np.asarray(a.d_skip[...]).std(), d**-0.5, rtol=0.25
  )
  with pytest.raises(ValueError, match='init'):
    ssm.SSMMixer(d, n, init='torch', rngs=nnx.Rngs(0))


def test_logits_all_is_causal_and_ends_in_the_readout():
  model = _paper_classifier()
  toks = jnp.asarray([[1, 2, 3, 1, 2, 0], [3, 3, 1, 2, 1, 2]])
  lens = jnp.asarray([5, 6])
  run = jax.jit(
    lambda t, n: (model.logits_all(t, n), model(t, n)),
    compiler_options=_CHEAP_XLA,
  )
  all_, last = run(toks, lens)
  np.testing.assert_allclose(all_[0, 4], last[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(all_[1, 5], last[1], rtol=1e-5, atol=1e-5)
  changed, _ = run(toks.at[:, 3].set(3), lens)
  np.testing.assert_allclose(changed[:, :3], all_[:, :3], rtol=1e-6)
  assert not np.allclose(changed[1, 3:], all_[1, 3:])


def test_paper_block_refuses_bidirectional():
  cfg = sc.ClassifierConfig(
    vocab_size=4, num_classes=2, mixer='pdssm_paper', d_model=8,
    state_size=8, bidirectional=True,
  )  # fmt: skip
  with pytest.raises(ValueError, match='bidirectional'):
    sc.SequenceClassifier(cfg, rngs=nnx.Rngs(0))


def test_magnitude_init_sets_the_initial_memory():
  u = jnp.asarray(np.random.default_rng(2).standard_normal((2, 3, 16)))
  diag = _jit(lambda m, v: m.diagonal(v))
  plain = ssm.SSMMixer(16, 16, init='authors', rngs=nnx.Rngs(0))
  held = ssm.SSMMixer(
    16, 16, init='authors', magnitude_init=0.97, rngs=nnx.Rngs(0)
  )
  # sigmoid(logit(0.97) + fc2 noise): the median stays near 0.97; without
  # the option it is sigmoid(noise) ~ 0.5.
  assert 0.9 < np.median(np.abs(np.asarray(diag(held, u)))) < 0.99
  assert 0.3 < np.median(np.abs(np.asarray(diag(plain, u)))) < 0.7
  with pytest.raises(ValueError, match='magnitude_init'):
    ssm.SSMMixer(16, 16, magnitude_init=1.0, rngs=nnx.Rngs(0))
