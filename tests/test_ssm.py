"""Tests for ddlm_jax.models.ssm and ddlm_jax.models.sequence_classifier.

References used here are written independently of the layer's scan path:
dense N x N transition matrices stepped one at a time in Python, automata
simulated with numpy, and autodiff through an explicit straight-through
expression.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st_

from ddlm_jax.data import state_tracking as st
from ddlm_jax.models import hardmax, ssm
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.parallel.rules import (
  DEFAULT_RULES,
  logical_names,
  logical_to_spec,
)


# Test inputs come from numpy: jax.random would compile threefry per shape.
def _randn(seed, *shape, scale=1.0):
  x = np.random.default_rng(seed).standard_normal(shape) * scale
  return jnp.asarray(x, jnp.float32)


def _rand_complex(seed, shape, scale=1.0):
  return jax.lax.complex(
    _randn(seed, *shape, scale=scale), _randn(seed + 1000, *shape, scale=scale)
  )


# Cheap XLA:CPU compilation: the test shapes are tiny, compile time dominates.
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


def _build(cls, *args, seed=0, **kwargs):
  """A fresh cls(*args, rngs=nnx.Rngs(seed), **kwargs); init jitted, cached."""
  return nnx.merge(*_build_state(cls, args, seed, tuple(kwargs.items())))


@functools.cache
def _build_state(cls, args, seed, kwargs):
  ctor = lambda: cls(*args, rngs=nnx.Rngs(seed), **dict(kwargs))
  graphdef, _ = nnx.split(nnx.eval_shape(ctor))
  init = jax.jit(lambda: nnx.split(ctor())[1], compiler_options=_CHEAP_XLA)
  return graphdef, init()


@_jit
def _forward(mixer, u_BxLxD, mask_BxL=None):
  """(h_BxLxN, y_BxLxD) of an SSMMixer."""
  h, _ = mixer.states(u_BxLxD, mask_BxL)
  return h, mixer.readout(h, u_BxLxD)


@_jit
def _states(mixer, u_BxLxD):
  return mixer.states(u_BxLxD)[0]


@_jit
def _apply(module, *args):
  return module(*args)


def _dense_scan(a_BxLxNxN, b_BxLxN, h0_BxN, reverse=False):
  """Sequential reference with dense transitions (Python loop over time)."""
  L = b_BxLxN.shape[1]
  h, out = h0_BxN, [None] * L
  for t in reversed(range(L)) if reverse else range(L):
    h = jnp.einsum('bij,bj->bi', a_BxLxNxN[:, t], h) + b_BxLxN[:, t]
    out[t] = h
  return jnp.stack(out, axis=1)


# ----------------------------------------------------------------------------
# Straight-through estimator.


def test_column_onehot_st_forward_and_gradient():
  m = _randn(0, 3, 5, 5)
  w = _randn(1, 3, 5, 5)
  p = hardmax.column_onehot_st(m, 0.7)
  np.testing.assert_array_equal(p.sum(-2), 1.0)
  np.testing.assert_array_equal(np.argmax(p, -2), np.argmax(np.asarray(m), -2))
  assert set(np.unique(p).tolist()) == {0.0, 1.0}
  g_st = jax.grad(lambda x: jnp.sum(w * hardmax.column_onehot_st(x, 0.7)))(m)
  g_soft = jax.grad(lambda x: jnp.sum(w * jax.nn.softmax(x / 0.7, axis=-2)))(m)
  np.testing.assert_allclose(g_st, g_soft, rtol=1e-6, atol=1e-7)
  assert np.abs(g_st).max() > 1e-3  # not trivially zero


@pytest.mark.parametrize('reverse', [False, True])
@pytest.mark.parametrize('impl', ['xla', 'reference'])
def test_pd_scan_st_gradient_matches_dense_straight_through(reverse, impl):
  B, L, N = 2, 6, 4
  m = _randn(2, B, L, N, N)
  d = _rand_complex(3, (B, L, N), 0.5)
  b = _rand_complex(4, (B, L, N))
  h0 = _rand_complex(5, (B, N))
  w = _rand_complex(6, (B, L, N))

  def loss_layer(m, d, b, h0):
    soft = hardmax.column_softmax(m, 0.5)
    h, hl = ssm.pd_scan_st(soft, d, b, h0, reverse, impl)
    return jnp.sum(jnp.real(w * h)) + jnp.sum(jnp.imag(hl))

  def loss_dense(m, d, b, h0):
    a = hardmax.column_onehot_st(m, 0.5) * d[..., None, :]
    h = _dense_scan(a, b, h0, reverse)
    hl = h[:, 0] if reverse else h[:, -1]
    return jnp.sum(jnp.real(w * h)) + jnp.sum(jnp.imag(hl))

  args = (m, d, b, h0)
  vg = lambda f: jax.jit(
    jax.value_and_grad(f, argnums=(0, 1, 2, 3)), compiler_options=_CHEAP_XLA
  )
  v1, g1 = vg(loss_layer)(*args)
  v2, g2 = vg(loss_dense)(*args)
  np.testing.assert_allclose(v1, v2, rtol=1e-5)
  for a, e in zip(g1, g2):
    np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
  assert np.abs(g1[0]).max() > 1e-3  # the P-gradient is really there


# ----------------------------------------------------------------------------
# Layer vs. references.


@pytest.mark.parametrize(
  'mode, reverse, initial_state',
  [('pdssm', False, 'zeros'), ('pdssm', True, 'zeros')]
  + [('pdssm', False, 'onehot'), ('complex_diag', True, 'onehot')]
  + [('selective_diag', False, 'zeros')],
)
def test_layer_scan_matches_dense_reference(mode, reverse, initial_state):
  B, L, D, N = 2, 9, 6, 5
  mixer = _build(
    ssm.SSMMixer, D, N, mode=mode, num_dict=3, initial_state=initial_state
  )
  mixer.reverse = reverse
  u = _randn(3, B, L, D)
  mask = jnp.arange(L)[None] < jnp.array([[6], [9]])

  # Dense reference built from the layer's own transition pieces.
  @_jit
  def reference(mixer, u):
    d = mixer.diagonal(u)
    b = mixer.inputs(u)
    if mode == 'pdssm':
      a = ssm.pd_to_dense(mixer.transition_indices(u), d)
    else:
      a = jax.vmap(jax.vmap(jnp.diag))(d)
    keep = mask[..., None]
    a = jnp.where(keep[..., None], a, jnp.eye(N, dtype=a.dtype))
    b = jnp.where(keep, b, 0)
    h0 = jnp.zeros((B, N), b.dtype)
    if initial_state == 'onehot':  # e_0, built independently of the layer
      h0 = jnp.broadcast_to(jnp.eye(N, dtype=b.dtype)[0], (B, N))
    h = _dense_scan(a, b, h0, reverse)
    return h, a, d

  h_ref, a, d = reference(mixer, u)
  outs = {}
  for impl in ('reference', 'xla'):
    mixer.scan_impl = impl
    h, outs[impl] = _forward(mixer, u, mask)
    np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    outs['xla'], outs['reference'], rtol=1e-5, atol=1e-5
  )
  if mode == 'pdssm':
    # A PD transition is not diagonal: the test would catch a P = I bug.
    assert not np.allclose(a, jax.vmap(jax.vmap(jnp.diag))(d))


def test_layer_gradients_agree_across_impls():
  mixer = _build(ssm.SSMMixer, 6, 5, mode='pdssm', num_dict=3)
  u = _randn(4, 2, 8, 6)

  def grads(impl):
    mixer.scan_impl = impl
    loss = lambda m: jnp.sum(jnp.sin(m(u)))
    return nnx.state(_jit(nnx.grad(loss))(mixer), nnx.Param)

  g_ref, g_xla = grads('reference'), grads('xla')
  jax.tree.map(
    lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5),
    g_xla,
    g_ref,
  )
  assert float(jnp.abs(g_ref['dictionary'][...]).max()) > 1e-4


def test_reverse_equals_forward_on_flipped_input():
  mixer = _build(ssm.SSMMixer, 6, 5, mode='pdssm', num_dict=3)
  u = _randn(5, 2, 10, 6)
  y_fwd_flipped = _apply(mixer, u[:, ::-1])[:, ::-1]
  mixer.reverse = True
  np.testing.assert_allclose(
    _apply(mixer, u), y_fwd_flipped, rtol=1e-5, atol=1e-5
  )


@settings(max_examples=10, deadline=None)
@given(scale=st_.sampled_from([0.1, 1.0, 30.0, 1e4]), seed=st_.integers(0, 99))
def test_transition_magnitude_below_one(scale, seed):
  u = _randn(seed, 2, 7, 6, scale=scale)
  for mode in ssm.MODES:
    diag = _diagonal(_small_mixers()[mode], u)
    mag = np.abs(np.asarray(diag))
    assert np.all(mag < 1.0) and np.all(mag >= 0.0), mode
    assert np.isrealobj(np.asarray(diag)) == (mode == 'selective_diag')


@_jit
def _diagonal(mixer, u):
  return mixer.diagonal(u)


@functools.cache
def _small_mixers():
  return {m: _build(ssm.SSMMixer, 6, 5, mode=m, num_dict=3) for m in ssm.MODES}


# ----------------------------------------------------------------------------
# Hand-set PD-SSM emulating automata exactly.


def _hand_set_pdssm(perms, start, n_states, impl):
  """PD-SSM whose token k+1 moves the one-hot state j -> perms[k][j].

  Token ids: 0 = PAD, 1..K = dictionary entries, K+1 = BOS (injects e_start
  through B). u is the one-hot token, so D = K + 2.
  """
  K = len(perms)
  D, N = K + 2, n_states
  mixer = _build(ssm.SSMMixer, D, N, num_dict=K, gate_hidden=2, scan_impl=impl)
  sel = np.zeros((D, K), np.float32)
  sel[np.arange(1, K + 1), np.arange(K)] = 30.0
  mixer.select.kernel[...] = jnp.asarray(sel)
  mixer.select.bias[...] = jnp.zeros(K)
  dic = np.zeros((K, N, N), np.float32)
  for k, perm in enumerate(perms):
    dic[k, np.asarray(perm), np.arange(N)] = 1.0  # column j -> row perm[j]
  mixer.dictionary[...] = jnp.asarray(dic)
  for mlp, bias in ((mixer.mag_mlp, 12.0), (mixer.phase_mlp, -40.0)):
    mlp.fc2.kernel[...] = jnp.zeros_like(mlp.fc2.kernel[...])
    mlp.fc2.bias[...] = jnp.full((N,), bias)
  b_re = np.zeros((D, N), np.float32)
  b_re[K + 1, start] = 1.0
  mixer.B_re[...] = jnp.asarray(b_re)
  mixer.B_im[...] = jnp.zeros((D, N))
  return mixer


def _run_automaton(mixer, tokens_BxL):
  D = mixer.d_model
  bos = jnp.full((tokens_BxL.shape[0], 1), D - 1)
  u = jax.nn.one_hot(jnp.concatenate([bos, tokens_BxL], 1), D)
  h = _states(mixer, u)
  return np.abs(np.asarray(h[:, 1:]))  # drop the BOS step


def _assert_one_hot_path(h_abs_BxLxN, states_BxL):
  assert (np.count_nonzero(h_abs_BxLxN, axis=-1) == 1).all()
  np.testing.assert_array_equal(h_abs_BxLxN.argmax(-1), states_BxL)
  assert h_abs_BxLxN.max(-1).min() > 0.99  # |D|^257 stays near 1


@pytest.mark.parametrize('task', ['parity', 'cycle_nav'])
def test_hand_set_pdssm_emulates_small_automata(task):
  data = st.make_split(task, 'test', 6, seed=0, min_len=256, max_len=256)
  toks = np.asarray(data['tokens'])
  if task == 'parity':
    perms, steps = [[0, 1], [1, 0]], np.array([0, 0, 1])
    states = np.cumsum(steps[toks], 1) % 2
  else:
    perms = [[0, 1, 2, 3, 4], [1, 2, 3, 4, 0], [4, 0, 1, 2, 3]]
    states = np.cumsum(np.array([0, 0, 1, -1])[toks], 1) % 5
  # The long associative (xla) scan on one task, the sequential on the other.
  impl = 'reference' if task == 'parity' else 'xla'
  mixer = _hand_set_pdssm(perms, 0, len(perms[0]), impl)
  h = _run_automaton(mixer, jnp.asarray(toks))
  _assert_one_hot_path(h, states)
  np.testing.assert_array_equal(h[:, -1].argmax(-1), data['labels'])


def test_hand_set_pdssm_emulates_a5_word_problem():
  data = st.make_split('a5', 'test', 4, seed=0, min_len=256, max_len=256)
  table = st.group_table('A5')
  # Token k+1 is element k; state e moves to e * g_k (apply e, then g_k).
  perms = [table[:, k] for k in range(60)]
  mixer = _hand_set_pdssm(perms, st.group_identity('A5'), 60, 'reference')
  toks = np.asarray(data['tokens'])
  h = _run_automaton(mixer, jnp.asarray(toks))
  states = np.zeros_like(toks)
  s = np.zeros(len(toks), np.int64)
  for t in range(toks.shape[1]):
    s = table[s, toks[:, t] - 1]
    states[:, t] = s
  _assert_one_hot_path(h, states)
  np.testing.assert_array_equal(h[:, -1].argmax(-1), data['labels'])


# ----------------------------------------------------------------------------
# Other mixers, blocks, metadata.


@pytest.mark.parametrize(
  'kind, combine', [('pdssm', 'sum'), ('lstm', 'concat')]
)
def test_bidirectional_mixer_respects_mask(kind, combine):
  mixer = _build(
    ssm.make_mixer,
    kind,
    6,
    state_size=5,
    num_dict=3,
    bidirectional=True,
    **({'scan_impl': 'reference'} if kind == 'pdssm' else {}),
    combine=combine,
    seed=4,
  )
  x = _randn(6, 2, 8, 6)
  lengths = jnp.array([5, 8])
  mask = jnp.arange(8)[None] < lengths[:, None]
  y1 = _apply(mixer, x, mask)
  noise = _randn(7, *x.shape)
  y2 = _apply(mixer, jnp.where(mask[..., None], x, noise), mask)
  assert y1.shape == x.shape
  np.testing.assert_allclose(y1[mask], y2[mask], rtol=1e-5, atol=1e-5)
  # Without the mask the reverse direction does see the padding.
  y3 = _apply(mixer, jnp.where(mask[..., None], x, noise))
  assert not np.allclose(y1[0, :5], y3[0, :5], atol=1e-4)


def test_lstm_reverse_matches_flipped_forward():
  mixer = _build(ssm.LSTMMixer, 6, 5, seed=5)
  x = _randn(8, 2, 6, 6)
  y_flip = _apply(mixer, x[:, ::-1])[:, ::-1]
  rev = _build(ssm.LSTMMixer, 6, 5, seed=5)
  rev.reverse = rev.rnn.reverse = True
  np.testing.assert_allclose(_apply(rev, x), y_flip, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('mixer', sorted(sc.MIXERS))
def test_params_carry_logical_axis_names(mixer):
  model = _build(sc.SequenceClassifier, _small_config(mixer))
  params = nnx.state(model, nnx.Param)
  for path, var in nnx.to_flat_state(params):
    names = var.get_metadata().get('out_sharding')
    assert names is not None, path
    assert len(names) == var[...].ndim, path
    # Every name has a sharding rule (the transformer mixer adds its own).
    assert set(names) - {None} <= set(DEFAULT_RULES), path
  # The names map to mesh axes through ddlm_jax.parallel.rules, as in
  # training: ('vocab', 'embed') -> ('tensor', 'fsdp') under DEFAULT_RULES.
  mesh = jax.make_mesh((1, 1, 1), ('data', 'fsdp', 'tensor'))
  table = params['embed']['embedding']
  spec = logical_to_spec(logical_names(table), table.shape, mesh)
  assert tuple(spec) == ('tensor', 'fsdp')


def test_classifier_reads_last_real_token():
  model = _build(sc.SequenceClassifier, _small_config('pdssm'))
  toks = jnp.asarray(np.random.default_rng(9).integers(1, 4, (3, 10)))
  lengths = jnp.array([3, 10, 7])
  logits = _apply(model, toks, lengths)
  assert logits.shape == (3, 5)
  # Changing tokens after each length leaves the logits unchanged.
  pad = jnp.where(jnp.arange(10)[None] < lengths[:, None], toks, 0)
  np.testing.assert_allclose(_apply(model, pad, lengths), logits, atol=1e-5)
  # The logit equals the head applied to the features at lengths - 1.
  feats = _jit(lambda m, t, n: m.features(t, n))(model, toks, lengths)
  np.testing.assert_allclose(
    logits[1], model.head(feats[1, 9]), rtol=1e-5, atol=1e-5
  )
  # Truncating sequence 0 to its length gives the same logits.
  short = _apply(model, toks[:1, :3], lengths[:1])
  np.testing.assert_allclose(short, logits[:1], rtol=1e-4, atol=1e-5)


def test_register_mixer_hook():
  name = '_test_identity_mixer'

  class Identity(nnx.Module):
    def __call__(self, x, mask=None):
      return x

  sc.register_mixer(name, lambda cfg, rngs: Identity())
  try:
    cfg = sc.ClassifierConfig(4, 2, mixer=name, d_model=8, num_layers=1)
    model = _build(sc.SequenceClassifier, cfg)
    assert model(jnp.ones((2, 5), jnp.int32), jnp.array([5, 2])).shape == (
      2,
      2,
    )
    with pytest.raises(ValueError, match='already registered'):
      sc.register_mixer(name, lambda cfg, rngs: Identity())
  finally:
    sc.MIXERS.pop(name)


def test_bad_inputs_raise():
  rngs = nnx.Rngs(0)
  with pytest.raises(ValueError, match='mode'):
    ssm.SSMMixer(4, 4, mode='dense', rngs=rngs)
  with pytest.raises(ValueError, match='scan_impl'):
    ssm.SSMMixer(4, 4, scan_impl='cuda', rngs=rngs)
  with pytest.raises(ValueError, match='initial_state'):
    ssm.SSMMixer(4, 4, initial_state='ones', rngs=rngs)
  with pytest.raises(ValueError, match='unknown mixer'):
    ssm.make_mixer('gru', 4, rngs=rngs)
  with pytest.raises(ValueError, match='unknown mixer'):
    sc.SequenceClassifier(sc.ClassifierConfig(4, 2, mixer='gru'), rngs=rngs)
  mixer = _build(ssm.SSMMixer, 6, 5, num_dict=3)
  with pytest.raises(ValueError, match='D=6'):
    mixer(jnp.ones((1, 5, 3)))
  with pytest.raises(ValueError, match='mask_BxL'):
    mixer(jnp.ones((1, 5, 6)), jnp.ones((1, 4), bool))
  with pytest.raises(ValueError, match='combine'):
    ssm.make_mixer('pdssm', 4, bidirectional=True, combine='mul', rngs=rngs)


# ----------------------------------------------------------------------------
# Smoke training: a few AdamW steps lower the loss for every model.


def _small_config(mixer):
  """Shared tiny classifier (vocab 4, 5 classes): one set of init shapes."""
  return sc.ClassifierConfig(
    4,
    5,
    mixer=mixer,
    d_model=16,
    state_size=8,
    num_dict=4,
    num_layers=1,
    scan_impl='reference',
  )


@functools.cache
def _train_step(mixer):
  """One jitted step per mixer, shared by both tasks (vocab 4, 5 classes).

  Parity uses only classes 0-1: ``class_mask`` removes the other logits, so
  the loss is a true 2-class cross-entropy while the compiled step is reused.
  """
  cfg = _small_config(mixer)
  graphdef, _, _ = nnx.split(
    nnx.eval_shape(lambda: sc.SequenceClassifier(cfg, rngs=nnx.Rngs(0))),
    nnx.Param,
    ...,
  )
  tx = optax.adamw(1e-2, weight_decay=0.01)

  @functools.partial(jax.jit, compiler_options=_CHEAP_XLA)
  def step(params, rest, opt_state, batch, class_mask):
    def loss_fn(p):
      logits = nnx.merge(graphdef, p, rest)(batch['tokens'], batch['lengths'])
      logits = jnp.where(class_mask, logits, -1e9)
      return sc.classification_metrics(logits, batch['labels'])[0]

    loss, g = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def init(seed):
    model = _build(sc.SequenceClassifier, cfg, seed=seed)  # cached
    _, params, rest = nnx.split(model, nnx.Param, ...)
    return params, rest, tx.init(params)

  return init, step


@pytest.mark.slow
@pytest.mark.parametrize('mixer', sorted(sc.MIXERS))
def test_smoke_training_loss_decreases(mixer):
  init, step = _train_step(mixer)
  for task in ('parity', 'cycle_nav'):
    data = st.make_split(task, 'train', 64, seed=0, min_len=3, max_len=12)
    batch = {k: jnp.asarray(v) for k, v in data.items()}
    class_mask = jnp.arange(5) < st.task_info(task)[1]
    params, rest, opt_state = init(0)
    losses = []
    for _ in range(80):
      params, opt_state, loss = step(params, rest, opt_state, batch, class_mask)
      losses.append(float(loss))
    assert np.isfinite(losses).all(), (mixer, task)
    assert np.mean(losses[-5:]) < 0.9 * losses[0], (mixer, task, losses)
