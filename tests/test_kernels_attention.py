"""Tests for pallas_kernels attention: flash kernel vs reference, masks, tiles.

The flash kernel runs with interpret=True on CPU (small blocks so several
tiles of every class appear); TPU lowering is checked by exporting for
platform 'tpu' from the CPU host.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pallas_kernels import MaskSpec, attention
from pallas_kernels.attention import (
  EMPTY,
  FULL,
  PARTIAL,
  flash_attention,
  static_tile_table,
  tile_table,
)

MASK_KINDS = (
  'full',
  'padding',
  'causal',
  'block_causal',
  'prefix_lm',
  'segments',
  'groups',
  'causal_padding',
)


def _make_mask(kind, rng, B, L, S):
  valid = rng.random((B, S)) < 0.7
  valid[:, 0] = True
  if kind == 'full':
    return MaskSpec.full()
  if kind == 'padding':
    return MaskSpec.full(jnp.asarray(valid))
  if kind == 'causal':
    return MaskSpec.causal()
  if kind == 'block_causal':
    return MaskSpec.block_causal(int(rng.integers(1, 9)))
  if kind == 'prefix_lm':
    return MaskSpec.prefix_lm(int(rng.integers(0, L + 1)))
  if kind == 'segments':
    ids = np.sort(rng.integers(0, 3, (B, L)), axis=1)
    return MaskSpec.segments(jnp.asarray(ids))
  if kind == 'groups':
    G = 3
    vis = rng.random((B, G, G)) < 0.5
    ids = jnp.asarray(rng.integers(0, G, (B, L)))
    kv_ids = jnp.asarray(rng.integers(0, G, (B, S))) if S != L else None
    return MaskSpec.groups(ids, jnp.asarray(vis), kv_ids)
  return MaskSpec.causal().with_kv_valid(jnp.asarray(valid))


def _qkv(rng, B, H, K, L, S, D, dtype):
  f = lambda *s: jnp.asarray(rng.normal(size=s), dtype)
  return f(B, H, L, D), f(B, K, S, D), f(B, K, S, D)


def _flash(q, k, v, mask, scale):
  # Blocks of 8 so every mask has empty, partial and full tiles.
  return flash_attention(
    q, k, v, mask, scale, interpret=True, block_q=8, block_k=8
  )


_flash_jit = jax.jit(_flash, static_argnums=(4,))


def _loss(fn, q, k, v):
  o = fn(q, k, v).astype(jnp.float32)
  w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
  return jnp.sum(o * w)


def _both(q, k, v, mask, scale):
  """(out, grads) of the flash kernel and of the reference, in one jit."""
  ref = lambda q, k, v: attention(
    q, k, v, mask=mask, impl='reference', sm_scale=scale
  )
  got = lambda q, k, v: _flash(q, k, v, mask, scale)
  res = []
  for fn in (got, ref):
    out = fn(q, k, v)
    res.append((out, jax.grad(_loss, argnums=(1, 2, 3))(fn, q, k, v)))
  return res


_both_jit = jax.jit(_both, static_argnums=(4,))


@pytest.mark.parametrize('kind', MASK_KINDS)
def test_flash_matches_reference_every_mask_kind(kind):
  # One random shape per mask kind, forward and gradients (one compile per
  # kind: the interpret-mode kernels dominate the time); blocks of 8 give
  # several tiles per axis, including a ragged last one.
  rng = np.random.default_rng(100 + MASK_KINDS.index(kind))
  B = int(rng.integers(1, 3))
  H, K = [(2, 1), (2, 2), (4, 2)][int(rng.integers(0, 3))]
  L, S, D = int(rng.integers(9, 22)), int(rng.integers(9, 22)), 8
  S = L if kind == 'segments' else S
  mask = _make_mask(kind, rng, B, L, S)
  q, k, v = _qkv(rng, B, H, K, L, S, D, jnp.float32)
  (o, g), (o_ref, g_ref) = _both_jit(q, k, v, mask, 0.3)
  np.testing.assert_allclose(o, o_ref, atol=2e-5)
  for x, y in zip(g, g_ref):
    np.testing.assert_allclose(x, y, atol=5e-5)


@settings(max_examples=3, deadline=None, derandomize=True)
@given(
  st.sampled_from(MASK_KINDS),
  st.sampled_from([jnp.float32, jnp.bfloat16]),
  st.tuples(st.integers(1, 2), st.integers(1, 24), st.integers(0, 999)),
)
def test_flash_forward_random_shapes_and_dtypes(kind, dtype, shape):
  B, L, seed = shape
  rng = np.random.default_rng(seed)
  mask = _make_mask(kind, rng, B, L, L)
  q, k, v = _qkv(rng, B, 4, 2, L, L, 8, dtype)
  o = _flash_jit(q, k, v, mask, 0.3)
  assert o.dtype == dtype
  ref = attention(q, k, v, mask=mask, impl='reference', sm_scale=0.3)
  o_xla = attention(q, k, v, mask=mask, impl='xla', sm_scale=0.3)
  tol = 2e-5 if dtype == jnp.float32 else 3e-2
  for x in (o, o_xla):
    np.testing.assert_allclose(
      x.astype(jnp.float32), ref.astype(jnp.float32), atol=tol
    )


def test_bf16_inputs_and_public_interpret_path():
  rng = np.random.default_rng(3)
  q, k, v = _qkv(rng, 1, 2, 2, 24, 24, 16, jnp.bfloat16)
  mask = MaskSpec.block_causal(5)
  o = attention(q, k, v, mask=mask, impl='interpret')
  assert o.dtype == jnp.bfloat16
  ref = attention(*(x.astype(jnp.float32) for x in (q, k, v)), mask=mask)
  np.testing.assert_allclose(o.astype(jnp.float32), ref, atol=3e-2)


def test_rows_without_keys_are_zero_and_empty_tiles_are_skipped():
  rng = np.random.default_rng(4)
  B, H, L, D = 1, 1, 16, 8
  q, k, v = _qkv(rng, B, H, H, L, L, D, jnp.float32)
  # Keys 8..15 invalid: their tile column is EMPTY. Fill them with NaN: a
  # kernel that touched them (even masked) would produce NaN.
  valid = jnp.arange(L)[None] < 8
  k = k.at[:, :, 8:].set(jnp.nan)
  v = v.at[:, :, 8:].set(jnp.nan)
  # Query 3 is in group 1, which sees nothing: its output must be zero.
  ids = jnp.zeros((1, L), jnp.int32).at[0, 3].set(1)
  vis = jnp.array([[[True, False], [False, False]]])
  mask = MaskSpec.groups(ids, vis).with_kv_valid(valid)
  run = jax.jit(
    lambda q, k, v, m: [
      _flash(q, k, v, m, 0.3),
      attention(
        q,
        k[:, :, :8],
        v[:, :, :8],
        mask=MaskSpec.groups(ids, vis, ids[:, :8]),
        sm_scale=0.3,
        impl='reference',
      ),
      attention(
        q, jnp.nan_to_num(k), jnp.nan_to_num(v), mask=m, impl='reference'
      ),
    ]
  )
  o, ref, ref_masked = run(q, k, v, mask)
  keep = jnp.arange(L) != 3
  np.testing.assert_allclose(o[:, :, keep], ref[:, :, keep], atol=2e-5)
  assert float(jnp.max(jnp.abs(o[0, 0, 3]))) == 0.0
  # The reference agrees on the empty row (on NaN-free keys: it multiplies
  # every key by its weight, zero or not).
  assert float(jnp.max(jnp.abs(ref_masked[0, 0, 3]))) == 0.0


# ------------------------------------------------------------- tile tables --


def _count_table(dense_BxLxS, bq, bk, S):
  """EMPTY/PARTIAL/FULL per tile by counting allowed entries in NumPy."""
  B, L, _ = dense_BxLxS.shape
  nq, nk = -(-L // bq), -(-S // bk)
  out = np.zeros((B, nq, nk), np.int32)
  for i in range(nq):
    for j in range(nk):
      blk = dense_BxLxS[:, i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
      n_keys_padded = bk - blk.shape[2]
      count = blk.sum(axis=(1, 2))
      full = (count == blk.shape[1] * blk.shape[2]) & (n_keys_padded == 0)
      out[:, i, j] = np.where(count == 0, EMPTY, np.where(full, FULL, PARTIAL))
  return out


@pytest.mark.parametrize(
  'spec',
  [
    MaskSpec.full(),
    MaskSpec.causal(),
    MaskSpec.block_causal(3),
    MaskSpec.block_causal(8),
    MaskSpec.prefix_lm(0),
    MaskSpec.prefix_lm(11),
  ],
  ids=lambda s: f'{s.kind}{s.block_size or s.prefix_len}',
)
def test_static_tile_table_matches_counting(spec):
  configs = (
    (37, 37, 8, 8),
    (40, 29, 16, 8),
    (24, 48, 8, 16),
    (23, 19, 6, 5),  # unaligned blocks reach every corner case
    (17, 30, 7, 3),
  )
  for L, S, bq, bk in configs:
    dense = np.asarray(spec.dense(1, L, S))
    table = static_tile_table(spec, L, S, bq, bk)
    np.testing.assert_array_equal(table, _count_table(dense, bq, bk, S)[0])


_table_jit = jax.jit(tile_table, static_argnums=(1, 2, 3, 4, 5))


def test_runtime_tile_tables_are_sound_and_exact_for_sorted_segments():
  rng = np.random.default_rng(9)
  B, L = 3, 40
  for kind in ('segments', 'groups', 'padding', 'causal_padding'):
    spec = _make_mask(kind, rng, B, L, L)
    dense = np.asarray(spec.dense(B, L, L))
    table = np.asarray(_table_jit(spec, B, L, L, 8, 8))
    truth = _count_table(dense, 8, 8, L)
    # Sound: EMPTY and FULL claims are never wrong.
    assert np.all(truth[table == EMPTY] == EMPTY), kind
    assert np.all(truth[table == FULL] == FULL), kind
    if kind in ('segments', 'padding'):
      np.testing.assert_array_equal(table, truth, err_msg=kind)


def test_bad_inputs_raise_clear_errors():
  q = jnp.zeros((1, 4, 8, 16))
  k = jnp.zeros((1, 3, 8, 16))
  with pytest.raises(ValueError, match='must divide'):
    attention(q, k, k)
  with pytest.raises(ValueError, match='shapes'):
    attention(q[0], q, q)
  with pytest.raises(ValueError, match='both have shape'):
    attention(q, q, q[..., :8])
  with pytest.raises(TypeError, match='MaskSpec'):
    attention(q, q, q, mask='causal')
  with pytest.raises(ValueError, match='expected'):
    attention(q, q, q, mask=MaskSpec.full(jnp.ones((1, 5), bool)))
  with pytest.raises(ValueError, match='at most'):
    MaskSpec.groups(jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 33, 33), bool))
  with pytest.raises(ValueError, match='block_size'):
    MaskSpec.block_causal(0)
  with pytest.raises(TypeError, match='integer'):
    MaskSpec.segments(jnp.zeros((1, 8)))
  with pytest.raises(ValueError, match='impl'):
    attention(q, q, q, impl='flash')


# ----------------------------------------------------------------- lowering --


@pytest.mark.parametrize('kind', ['causal', 'segments', 'groups'])
def test_flash_lowers_for_tpu(kind):
  B, H, K, L, D = 2, 4, 2, 256, 64
  rng = np.random.default_rng(0)
  mask = _make_mask(kind, rng, B, L, L)
  q = jax.ShapeDtypeStruct((B, H, L, D), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((B, K, L, D), jnp.bfloat16)

  def f(q, k, v, mask):
    fn = lambda q, k, v: attention(q, k, v, mask=mask, impl='pallas')
    return jax.value_and_grad(
      lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 1, 2)
    )(q, k, v)

  exp = jax.export.export(jax.jit(f), platforms=['tpu'])(q, kv, kv, mask)
  # Forward, dK/dV and dQ kernels.
  assert exp.mlir_module().count('tpu_custom_call') == 3


def _compiled_check():
  rng = np.random.default_rng(0)
  B, H, K, L, D = 2, 4, 2, 300, 64
  q, k, v = _qkv(rng, B, H, K, L, L, D, jnp.float32)
  for kind in MASK_KINDS:
    mask = _make_mask(kind, rng, B, L, L)
    ref_fn = lambda q, k, v, m=mask: attention(
      q, k, v, mask=m, impl='reference'
    )
    fn = lambda q, k, v, m=mask: attention(q, k, v, mask=m, impl='pallas')
    np.testing.assert_allclose(fn(q, k, v), ref_fn(q, k, v), atol=2e-2)
    g = jax.grad(_loss, argnums=(1, 2, 3))(fn, q, k, v)
    g_ref = jax.grad(_loss, argnums=(1, 2, 3))(ref_fn, q, k, v)
    for x, y in zip(g, g_ref):
      np.testing.assert_allclose(x, y, atol=5e-2)


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != 'tpu', reason='needs a TPU')
def test_compiled_flash_tpu():
  _compiled_check()
