"""Tests for pallas_kernels scans: kernels vs references, gradients, algebra.

Pallas kernels run with interpret=True on CPU; TPU lowering is checked by
exporting for platform 'tpu' from the CPU host. Compiled-kernel tests are
marked gpu/tpu and skipped without the backend.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pallas_kernels import (
  linear_combine,
  linear_scan,
  pd_apply,
  pd_apply_transpose,
  pd_combine,
  pd_identity,
  pd_scan,
)
from pallas_kernels._common import merge_planes, split_planes
from pallas_kernels.scan.kernels import linear_scan_planes, pd_scan_planes

IMPLS = ('reference', 'xla', 'interpret')
SETTINGS = settings(max_examples=3, deadline=None, derandomize=True)


def _rand(rng, shape, dtype, scale=1.0):
  x = rng.normal(size=shape)
  if np.issubdtype(dtype, np.complexfloating):
    x = x + 1j * rng.normal(size=shape)
  return jnp.asarray(scale * x, dtype)


def _err(x, y):
  return float(jnp.max(jnp.abs(jnp.asarray(x) - jnp.asarray(y))))


def _inputs(seed, B, L, N, dtype, with_h0):
  rng = np.random.default_rng(seed)
  a = _rand(rng, (B, L, N), dtype, 0.6)
  b = _rand(rng, (B, L, N), dtype)
  p = jnp.asarray(rng.integers(0, N, (B, L, N)), jnp.int32)
  h0 = _rand(rng, (B, N), dtype) if with_h0 else None
  return p, a, b, h0


shapes = st.tuples(
  st.integers(1, 2), st.integers(1, 12), st.integers(1, 6), st.integers(0, 99)
)
dtypes = st.sampled_from([np.float32, np.complex64])


@SETTINGS
@given(shapes, dtypes, st.booleans(), st.booleans())
def test_linear_scan_impls_match_reference(shape, dtype, reverse, with_h0):
  B, L, N, seed = shape
  _, a, b, h0 = _inputs(seed, B, L, N, dtype, with_h0)
  run = jax.jit(
    lambda a, b, h0: [
      linear_scan(a, b, h0_BxN=h0, reverse=reverse, impl=impl) for impl in IMPLS
    ]
  )
  (h_ref, hl_ref), *others = run(a, b, h0)
  assert h_ref.dtype == dtype and h_ref.shape == (B, L, N)
  np.testing.assert_allclose(hl_ref, h_ref[:, 0 if reverse else -1])
  for impl, (h, hl) in zip(IMPLS[1:], others):
    assert _err(h, h_ref) < 1e-5 and _err(hl, hl_ref) < 1e-5, impl


@SETTINGS
@given(shapes, dtypes, st.booleans(), st.booleans())
def test_pd_scan_impls_match_reference(shape, dtype, reverse, with_h0):
  B, L, N, seed = shape
  p, d, b, h0 = _inputs(seed, B, L, N, dtype, with_h0)
  run = jax.jit(
    lambda p, d, b, h0: [
      pd_scan(p, d, b, h0_BxN=h0, reverse=reverse, impl=impl) for impl in IMPLS
    ]
  )
  (h_ref, hl_ref), *others = run(p, d, b, h0)
  np.testing.assert_allclose(hl_ref, h_ref[:, 0 if reverse else -1])
  for impl, (h, hl) in zip(IMPLS[1:], others):
    assert _err(h, h_ref) < 1e-5 and _err(hl, hl_ref) < 1e-5, impl


def test_reverse_is_forward_on_flipped_sequence():
  p, d, b, h0 = _inputs(1, 2, 9, 4, np.complex64, True)
  flip = lambda x: jnp.flip(x, axis=1)
  h_r, hl_r = pd_scan(p, d, b, h0_BxN=h0, reverse=True, impl='reference')
  h_f, hl_f = pd_scan(flip(p), flip(d), flip(b), h0_BxN=h0, impl='reference')
  assert _err(h_r, flip(h_f)) < 1e-6 and _err(hl_r, hl_f) < 1e-6
  # Reverse recurrence, written out: h_t = A_t h_{t+1} + b_t.
  expect = pd_apply(p[:, 3], d[:, 3], h_r[:, 4]) + b[:, 3]
  assert _err(h_r[:, 3], expect) < 1e-5


def _loss(scan, impl, reverse, *xs):
  h, hl = scan(*xs, impl=impl, reverse=reverse)
  w = jnp.cos(jnp.arange(h.size, dtype=jnp.float32)).reshape(h.shape)
  return jnp.sum(jnp.abs(h * w) ** 2) + jnp.sum(jnp.real(hl) - jnp.imag(hl))


@pytest.mark.parametrize(
  'dtype,reverse',
  [(np.float32, False), (np.complex64, False), (np.complex64, True)],
)
def test_gradients_match_reference(dtype, reverse):
  p, a, b, h0 = _inputs(11, 2, 6, 3, dtype, True)

  def lin(a, b, h0, impl):
    f = lambda a, b, h0, **k: linear_scan(a, b, h0_BxN=h0, **k)
    return _loss(f, impl, reverse, a, b, h0)

  def pd(d, b, h0, impl):
    f = lambda d, b, h0, **k: pd_scan(p, d, b, h0_BxN=h0, **k)
    return _loss(f, impl, reverse, d, b, h0)

  # The Pallas path has a hand-written backward; xla uses autodiff (checked
  # once, its compile is the slow part).
  impls = ('reference', 'interpret')
  if dtype == np.complex64 and reverse:
    impls += ('xla',)

  @jax.jit
  def grads(a, b, h0):
    return [
      [jax.grad(fn, argnums=(0, 1, 2))(a, b, h0, i) for i in impls]
      for fn in (lin, pd)
    ]

  for g_ref, *gs in grads(a, b, h0):
    for impl, g in zip(impls[1:], gs):
      for x, y in zip(g, g_ref):
        assert x.dtype == y.dtype
        assert _err(x, y) < 1e-4 * (1 + float(jnp.max(jnp.abs(y)))), impl


def test_pd_gradient_matches_finite_differences():
  # Independent of autodiff: directional derivative along a random
  # direction in (d, b, h0) against a central difference in float64-free
  # arithmetic (the scan is polynomial, so the step can be moderate).
  p, d, b, h0 = _inputs(4, 1, 5, 3, np.complex64, True)
  f = lambda d, b, h0: _loss(
    lambda *x, **k: pd_scan(p, *x[:2], h0_BxN=x[2], **k),
    'interpret',
    False,
    d,
    b,
    h0,
  )
  rng = np.random.default_rng(5)
  dirs = [_rand(rng, x.shape, np.complex64) for x in (d, b, h0)]
  f = jax.jit(f)
  g = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(d, b, h0)
  # JAX's convention for a real loss of complex z: dL = Re(sum(g * dz)).
  pred = sum(float(jnp.real(jnp.sum(gi * vi))) for gi, vi in zip(g, dirs))
  eps = 1e-2
  plus = f(*(x + eps * v for x, v in zip((d, b, h0), dirs)))
  minus = f(*(x - eps * v for x, v in zip((d, b, h0), dirs)))
  fd = float(plus - minus) / (2 * eps)
  assert abs(fd - pred) < 2e-2 * (1 + abs(pred))


def _blocked(p, a, b, h0, block_l, with_pd):
  """Reference vs kernel with a given time block, both directions."""
  out = []
  planes = [split_planes(x) for x in (a, b, h0)]
  for reverse in (False, True):
    kw = dict(h0_BxN=h0, reverse=reverse, impl='reference')
    got = linear_scan_planes(
      *planes, reverse=reverse, interpret=True, block_l=block_l
    )
    out.append((linear_scan(a, b, **kw), got))
    if with_pd:
      got = pd_scan_planes(
        p,
        *planes,
        reverse=reverse,
        transpose=False,
        interpret=True,
        block_l=block_l,
      )
      out.append((pd_scan(p, a, b, **kw), got))
  return out


def test_kernel_multi_block_and_padding():
  # block_l=8 with L=21 gives 3 time blocks (padded to 24): the state must
  # carry across blocks in both directions; N=130 pads lanes to 256.
  for L, N, block_l in ((21, 5, 8), (3, 130, 128)):
    p, a, b, h0 = _inputs(L, 2, L, N, np.complex64, True)
    run = jax.jit(_blocked, static_argnums=(4, 5))
    for (h_ref, hl_ref), (h, hl) in run(p, a, b, h0, block_l, N < 8):
      assert _err(merge_planes(h), h_ref) < 1e-5
      assert _err(merge_planes(hl), hl_ref) < 1e-5


def _transposed_reference(p, d, b, h0, reverse):
  """h_t = A_t^T h_prev + b_t by lax.scan, (A^T g)[j] = d[j] g[p[j]]."""

  def step(h, x):
    h = pd_apply_transpose(x[0], x[1], h) + x[2]
    return h, h

  xs = tuple(jnp.swapaxes(x, 0, 1) for x in (p, d, b))
  hl, h = jax.lax.scan(step, h0, xs, reverse=reverse)
  return jnp.swapaxes(h, 0, 1), hl


@pytest.mark.parametrize('dtype', [np.float32, np.complex64])
def test_gpu_layout_kernels_match_reference(dtype):
  # The Triton kernels in interpret mode: N = 70 pads the diagonal scan to
  # two 64-lane blocks and the PD scan to 128 lanes; transposed PD is the
  # kernel the PD backward runs.
  p, a, b, h0 = _inputs(7, 2, 13, 70, dtype, True)

  @jax.jit
  def run(p, a, b, h0):
    planes = [split_planes(x) for x in (a, b, h0)]
    out = []
    for reverse in (False, True):
      kw = dict(h0_BxN=h0, reverse=reverse, impl='reference')
      lin = linear_scan_planes(
        *planes, reverse=reverse, interpret=True, layout='gpu'
      )
      out.append((linear_scan(a, b, **kw), lin))
      for transpose in (False, True):
        got = pd_scan_planes(
          p,
          *planes,
          reverse=reverse,
          transpose=transpose,
          interpret=True,
          layout='gpu',
        )
        if transpose:
          ref = _transposed_reference(p, a, b, h0, reverse)
        else:
          ref = pd_scan(p, a, b, **kw)
        out.append((ref, got))
    return out

  for (h_ref, hl_ref), (h, hl) in run(p, a, b, h0):
    assert _err(merge_planes(h), h_ref) < 1e-4
    assert _err(merge_planes(hl), hl_ref) < 1e-4


def test_bf16_accumulates_in_f32():
  _, a, b, _ = _inputs(3, 1, 64, 4, np.float32, False)
  a = (0.9 + 0.1 * jnp.tanh(a)).astype(jnp.bfloat16)
  b = b.astype(jnp.bfloat16)
  h_ref, _ = linear_scan(
    a.astype(jnp.float32), b.astype(jnp.float32), impl='reference'
  )
  for impl in ('reference', 'xla', 'interpret'):
    h, hl = linear_scan(a, b, impl=impl)
    assert h.dtype == jnp.bfloat16 and hl.dtype == jnp.bfloat16
    # Only the final rounding to bf16 (8 mantissa bits) is lost.
    rel = jnp.abs(h.astype(jnp.float32) - h_ref) / (1 + jnp.abs(h_ref))
    assert float(jnp.max(rel)) < 1e-2, impl


# ----------------------------------------------------------------- algebra --


def _elem(rng, shape, n):
  p = jnp.asarray(rng.integers(0, n, shape + (n,)), jnp.int32)
  return (
    p,
    _rand(rng, shape + (n,), np.complex64),
    _rand(rng, shape + (n,), np.complex64),
  )


def _dense(p, d):
  """Dense A with A[:, j] = d[j] e_{p[j]} (single element, NumPy)."""
  n = p.shape[-1]
  A = np.zeros((n, n), np.complex128)
  A[np.asarray(p), np.arange(n)] = np.asarray(d)
  return A


def test_pd_combine_associative_with_identity():
  rng = np.random.default_rng(0)
  x, y, z = (_elem(rng, (3,), 7) for _ in range(3))
  left = pd_combine(pd_combine(x, y), z)
  right = pd_combine(x, pd_combine(y, z))
  np.testing.assert_array_equal(left[0], right[0])
  assert _err(left[1], right[1]) < 1e-5 and _err(left[2], right[2]) < 1e-5
  e = pd_identity(x[0].shape, jnp.complex64)
  for got in (pd_combine(e, x), pd_combine(x, e)):
    np.testing.assert_array_equal(got[0], x[0])
    assert _err(got[1], x[1]) == 0 and _err(got[2], x[2]) == 0
  # The combine is the composition of affine maps, written densely.
  p, d, b = pd_combine(x, y)
  for i in range(3):
    A = _dense(y[0][i], y[1][i]) @ _dense(x[0][i], x[1][i])
    np.testing.assert_allclose(_dense(p[i], d[i]), A, atol=1e-5)
    expect = _dense(y[0][i], y[1][i]) @ np.asarray(x[2][i]) + y[2][i]
    np.testing.assert_allclose(b[i], expect, atol=1e-5)
  la = linear_combine(linear_combine(x[1:], y[1:]), z[1:])
  ra = linear_combine(x[1:], linear_combine(y[1:], z[1:]))
  assert _err(la[0], ra[0]) < 1e-5 and _err(la[1], ra[1]) < 1e-5


def test_pd_scan_equals_dense_matrix_scan():
  p, d, b, h0 = _inputs(5, 2, 12, 6, np.complex64, True)
  h = np.asarray(h0, np.complex128)
  expect = []
  for t in range(12):
    h = np.stack(
      [_dense(p[i, t], d[i, t]) @ h[i] + np.asarray(b[i, t]) for i in range(2)]
    )
    expect.append(h)
  expect = np.stack(expect, axis=1)
  for impl in ('reference', 'xla', 'interpret'):
    got, _ = pd_scan(p, d, b, h0_BxN=h0, impl=impl)
    np.testing.assert_allclose(got, expect, atol=1e-4, err_msg=impl)


def test_pd_scan_emulates_cycle_automaton_exactly():
  # Cycle navigation mod 5: tokens STAY/+1/-1 move a one-hot state; the
  # transition is a permutation p[j] = (j + delta) mod 5 with d = 1, b = 0.
  rng = np.random.default_rng(7)
  B, L, n = 3, 24, 5
  tokens = rng.integers(0, 3, (B, L))
  delta = np.array([0, 1, -1])[tokens]
  p = (np.arange(n)[None, None, :] + delta[..., None]) % n
  d = jnp.ones((B, L, n), jnp.complex64)
  b = jnp.zeros((B, L, n), jnp.complex64)
  h0 = jnp.zeros((B, n), jnp.complex64).at[:, 0].set(1.0)
  positions = np.cumsum(delta, axis=1) % n
  run = jax.jit(
    lambda p: [pd_scan(p, d, b, h0_BxN=h0, impl=impl) for impl in IMPLS]
  )
  for h, hl in run(jnp.asarray(p, jnp.int32)):
    np.testing.assert_array_equal(np.argmax(np.abs(h), -1), positions)
    np.testing.assert_array_equal(
      np.asarray(hl), np.eye(n)[positions[:, -1]].astype(np.complex64)
    )


# --------------------------------------------------------------- validation --


def test_bad_inputs_raise_clear_errors():
  x = jnp.zeros((2, 4, 3))
  p = jnp.zeros((2, 4, 3), jnp.int32)
  with pytest.raises(ValueError, match=r'\(B, L, N\)'):
    linear_scan(x[0], x[0])
  with pytest.raises(ValueError, match='must match'):
    linear_scan(x, x[:, :2])
  with pytest.raises(TypeError, match='floating or complex'):
    linear_scan(p, x)
  with pytest.raises(ValueError, match='h0_BxN'):
    linear_scan(x, x, h0_BxN=jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match='impl'):
    linear_scan(x, x, impl='cuda')
  with pytest.raises(TypeError, match='reverse'):
    linear_scan(x, x, reverse=1)
  with pytest.raises(TypeError, match='integer'):
    pd_scan(x, x, x)
  with pytest.raises(ValueError, match='must match'):
    pd_scan(p, x, x[:, :, :2])
  with pytest.raises(ValueError, match='L >= 1'):
    pd_scan(p[:, :0], x[:, :0], x[:, :0])


# ----------------------------------------------------------------- lowering --


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.complex64])
def test_kernels_lower_for_tpu(dtype):
  B, L, N = 2, 256, 128
  sds = jax.ShapeDtypeStruct((B, L, N), dtype)
  h0 = jax.ShapeDtypeStruct((B, N), dtype)
  p = jnp.zeros((B, L, N), jnp.int32)

  def lin(a, b, h0):
    h, hl = linear_scan(a, b, h0_BxN=h0, impl='pallas')
    return jnp.sum(jnp.abs(h)) + jnp.sum(jnp.abs(hl))

  def pd(d, b, h0):
    h, hl = pd_scan(p, d, b, h0_BxN=h0, reverse=True, impl='pallas')
    return jnp.sum(jnp.abs(h)) + jnp.sum(jnp.abs(hl))

  for fn in (lin, pd):
    exp = jax.export.export(
      jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2))), platforms=['tpu']
    )(sds, sds, h0)
    # Forward kernel plus the backward (reverse / transposed) kernel.
    assert exp.mlir_module().count('tpu_custom_call') == 2


def _compiled_check():
  p, a, b, h0 = _inputs(0, 2, 300, 128, np.complex64, True)
  for reverse in (False, True):
    kw = dict(h0_BxN=h0, reverse=reverse)
    ref = linear_scan(a, b, impl='reference', **kw)
    got = linear_scan(a, b, impl='pallas', **kw)
    assert max(_err(x, y) for x, y in zip(got, ref)) < 1e-4
    ref = pd_scan(p, a, b, impl='reference', **kw)
    got = pd_scan(p, a, b, impl='pallas', **kw)
    assert max(_err(x, y) for x, y in zip(got, ref)) < 1e-4


def _compiled_grad_check():
  p, a, b, h0 = _inputs(1, 2, 300, 96, np.complex64, True)
  for scan, args in ((linear_scan, (a, b, h0)), (pd_scan, (p, a, b, h0))):
    n = len(args)
    for reverse in (False, True):
      grads = []
      for impl in ('reference', 'pallas'):

        def loss(*xs, impl=impl, scan=scan, reverse=reverse):
          h, hl = scan(*xs[:-1], h0_BxN=xs[-1], reverse=reverse, impl=impl)
          return jnp.sum(jnp.abs(h) ** 2) + jnp.sum(jnp.abs(hl) ** 2)

        argnums = tuple(range(n - 3, n))
        grads.append(jax.grad(loss, argnums=argnums)(*args))
      for x, y in zip(*grads):
        assert _err(x, y) < 1e-3 * (1 + float(jnp.max(jnp.abs(y))))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs a GPU')
def test_compiled_kernels_gpu():
  # 'auto' stays on XLA on GPU (no GPU benchmark yet, see _common.AUTO_IMPL);
  # impl='pallas' runs the Triton kernels.
  p, a, b, h0 = _inputs(0, 2, 300, 128, np.complex64, True)
  ref = pd_scan(p, a, b, h0_BxN=h0, impl='reference')
  got = pd_scan(p, a, b, h0_BxN=h0)
  assert max(_err(x, y) for x, y in zip(got, ref)) < 1e-4
  _compiled_check()
  _compiled_grad_check()


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != 'tpu', reason='needs a TPU')
def test_compiled_kernels_tpu():
  _compiled_check()
