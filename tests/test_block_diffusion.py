"""Block diffusion (BD3-LM): process, mask kind, model path and KV cache.

Exact checks wherever one exists: the mask against its definition, its tile
table by counting, gradient sparsity through a real transformer, the one-
block process against MaskedDiffusion on the same network, the one-token-
block process against the AR likelihood by enumeration and quadrature, the
cached block-by-block forward against the 2L training pass.
"""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import BlockDiffusion, MaskedDiffusion, get_schedule
from ddlm_jax.diffusion.block import select_clip
from ddlm_jax.models import hybrid
from ddlm_jax.models.transformer import Transformer, TransformerConfig
from pallas_kernels import MaskSpec, attention
from pallas_kernels.attention import (
  EMPTY,
  FULL,
  PARTIAL,
  flash_attention,
  skipped_fraction,
  static_tile_table,
)

V = 5


def _rule(q, k, n, bs):
  """BD3-LM's mask, written as in the paper (BD3-LM, arXiv 2503.09573)."""
  clean_q, clean_k = q >= n, k >= n
  block_q, block_k = (q % n) // bs, (k % n) // bs
  return (
    (block_q == block_k and clean_q == clean_k)
    or (block_q > block_k and clean_k and not clean_q)
    or (block_q >= block_k and clean_k and clean_q)
  )


def _rule_dense(n, bs):
  pos = range(2 * n)
  return np.array([[_rule(q, k, n, bs) for k in pos] for q in pos])


def _model(block_size, *, depth=1, seed=0, **kw):
  """A tiny block-diffusion transformer with random host-drawn parameters.

  Every weight is generic (the untied head and the adaLN projections start
  at zero, which would make comparisons vacuous), and drawing them in NumPy
  compiles nothing.
  """
  cfg = TransformerConfig(
    V, V + 1, width=16, depth=depth, num_heads=2, block_size=block_size,
    **kw,
  )  # fmt: skip
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  rng = np.random.default_rng(seed)
  draw = lambda a: (0.5 * rng.normal(size=a.shape)).astype(a.dtype)
  return nnx.merge(graphdef, jax.tree.map(draw, state))


def _tokens(seed, shape, high=V):
  """Host data (NumPy): eager jax ops would each compile a tiny program."""
  return np.random.default_rng(seed).integers(0, high, shape).astype(np.int32)


def _noisy(x, seed, rate=0.5):
  masked = np.random.default_rng(seed).random(x.shape) < rate
  return np.where(masked, V, x).astype(np.int32)


# ------------------------------------------------------------------ mask --


@pytest.mark.parametrize('n,bs', [(8, 1), (8, 2), (8, 8), (12, 3), (6, 2)])
def test_mask_kind_matches_the_definition(n, bs):
  spec = MaskSpec.block_diffusion(bs, n)
  dense = np.asarray(spec.dense(2, 2 * n, 2 * n))
  np.testing.assert_array_equal(dense[0], _rule_dense(n, bs))
  np.testing.assert_array_equal(dense[1], dense[0])


def _count_table(dense_LxS, bq, bk):
  L, S = dense_LxS.shape
  out = np.zeros((-(-L // bq), -(-S // bk)), np.int32)
  for i, j in np.ndindex(out.shape):
    tile = dense_LxS[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
    full = tile.all() and tile.shape[1] == bk  # Padded keys: at most PARTIAL.
    out[i, j] = EMPTY if not tile.any() else FULL if full else PARTIAL
  return out


def test_tile_table_is_exact_tile_by_tile():
  # Unaligned tiles straddle blocks and the noisy/clean boundary.
  for n, bs in [(8, 1), (8, 2), (8, 4), (12, 3), (10, 5), (6, 6)]:
    spec = MaskSpec.block_diffusion(bs, n)
    dense = _rule_dense(n, bs)
    for bq, bk in itertools.product([1, 2, 3, 5, 7, 8, 32], repeat=2):
      table = static_tile_table(spec, 2 * n, 2 * n, bq, bk)
      np.testing.assert_array_equal(
        table, _count_table(dense, bq, bk), err_msg=f'{n} {bs} {bq} {bk}'
      )


def test_skipped_fraction_reports_the_empty_tiles():
  # 2L = 1024 at the default 128 blocks: 8 x 8 tiles, block size 128 puts
  # every tile inside one (half, block) pair, so the fractions are exact
  # counts of the block-level pattern: per half-pair of 4 x 4 blocks the
  # noisy-noisy quarter is diagonal (4 of 16 allowed), noisy-clean strictly
  # lower (6), clean-noisy empty (0), clean-clean lower with diagonal (10).
  spec = MaskSpec.block_diffusion(128, 512)
  empty, full = skipped_fraction(spec, 1, 1024, 1024)
  assert full == (4 + 6 + 10) / 64
  assert empty == 1 - full


def test_flash_interpret_and_xla_match_the_reference():
  n, bs, D = 12, 4, 8
  spec = MaskSpec.block_diffusion(bs, n)
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(1, 2, 2 * n, D)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(1, 1, 2 * n, D)), jnp.float32)
          for _ in range(2))  # fmt: skip
  w = jnp.cos(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)

  def run(fn):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v) * w)
    return fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  flash = lambda q, k, v: flash_attention(
    q, k, v, spec, 0.3, interpret=True, block_q=8, block_k=8
  )
  ref = lambda q, k, v: attention(
    q, k, v, mask=spec, impl='reference', sm_scale=0.3
  )
  xla = lambda q, k, v: attention(q, k, v, mask=spec, impl='xla', sm_scale=0.3)
  (o_ref, g_ref), (o_f, g_f), (o_x, g_x) = jax.jit(
    lambda: [run(ref), run(flash), run(xla)]
  )()
  for o, g in ((o_f, g_f), (o_x, g_x)):
    np.testing.assert_allclose(o, o_ref, atol=2e-5)
    for a, b in zip(g, g_ref):
      np.testing.assert_allclose(a, b, atol=5e-5)


def test_flash_lowers_for_tpu():
  # The in-kernel rule (iota arithmetic, lax.div, boolean algebra) must
  # lower through Mosaic: forward, dK/dV and dQ kernels.
  n, D = 256, 64
  spec = MaskSpec.block_diffusion(16, n)
  q = jax.ShapeDtypeStruct((1, 2, 2 * n, D), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((1, 1, 2 * n, D), jnp.bfloat16)
  fn = lambda q, k, v: attention(q, k, v, mask=spec, impl='pallas')
  loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  exp = jax.export.export(grads, platforms=['tpu'])(q, kv, kv)
  assert exp.mlir_module().count('tpu_custom_call') == 3


def test_mask_kind_rejects_bad_sizes():
  with pytest.raises(ValueError, match='divides the length'):
    MaskSpec.block_diffusion(3, 8)
  with pytest.raises(ValueError, match='block_size'):
    MaskSpec.block_diffusion(0, 8)
  q = jnp.zeros((1, 1, 12, 8))
  with pytest.raises(ValueError, match='16 positions'):
    attention(q, q, q, mask=MaskSpec.block_diffusion(2, 8))


# ----------------------------------------------------------------- model --


def test_gradient_sparsity_is_the_mask():
  """d logits[i] / d input[j] is nonzero exactly where the mask allows."""
  L, bs = 8, 2
  model = _model(bs, seed=1)
  x = np.eye(V + 1, dtype=np.float32)[_tokens(0, (1, 2 * L), V + 1)]
  jac = jax.jit(jax.jacrev(lambda x: model(x)[0]))(x)  # [2L, V, 1, 2L, V+1]
  dep = np.abs(np.asarray(jac)).max(axis=(1, 2, 4)) > 0
  np.testing.assert_array_equal(dep, _rule_dense(L, bs))


def test_kv_cache_equals_the_full_pass():
  """block_logits(z_b | cache of x_<b) == the 2L pass at noisy block b.

  In the 2L pass, noisy block b sees z_b and the clean blocks < b, whose
  hidden states are themselves computed block-causally from x_<b, which is
  exactly what extend_cache builds. So the full pass on concat(z', x') with
  z' = z in block b only and x' = x before block b (anything after) gives
  the same logits at block b.
  """
  L, bs, B = 8, 2, 2
  model = _model(bs, depth=2, seed=2)
  x, junk = _tokens(1, (B, L)), _tokens(3, (B, L))
  z = _noisy(x, 2)
  ids = np.arange(L) // bs
  # Full passes with only block b noisy and junk from block b on.
  z_only = np.stack([np.where(ids == b, z, V) for b in range(L // bs)])
  x_prefix = np.stack([np.where(ids < b, x, junk) for b in range(L // bs)])

  def by_blocks(model, noisy):
    # The sampler's loop: traced start, a cache longer than L.
    def body(b, carry):
      cache, out = carry
      start = b * bs
      zb = jax.lax.dynamic_slice_in_dim(noisy, start, bs, 1)
      logits = model.block_logits(zb, cache, start)
      out = jax.lax.dynamic_update_slice_in_dim(out, logits, start, 1)
      xb = jax.lax.dynamic_slice_in_dim(x, start, bs, 1)
      return model.extend_cache(xb, cache, start), out

    init = (model.init_cache(B, L + 4), jnp.zeros((B, L, V)))
    return jax.lax.fori_loop(0, L // bs, body, init)

  @jax.jit
  def run(model):
    two_l = np.concatenate(
      [np.stack([z, *z_only]), np.stack([x, *x_prefix])], 2
    )
    outs = jax.vmap(lambda tokens: model(tokens)[:, :L])(two_l)
    # The second run's noisy input is junk: the cache must not see it.
    caches, gots = jax.vmap(lambda n: by_blocks(model, n))(np.stack([z, junk]))
    first = lambda tree: jax.tree.map(lambda a: a[0], tree)
    second = lambda tree: jax.tree.map(lambda a: a[1], tree)
    return outs[0], outs[1:], gots[0], first(caches), second(caches)

  full, alt, got, cache, clean = jax.tree.map(np.asarray, run(model))
  np.testing.assert_allclose(got, full, atol=1e-5)
  for b in range(L // bs):
    np.testing.assert_allclose(
      alt[b][:, ids == b], full[:, ids == b], atol=1e-5
    )
  # Cached keys of the clean blocks do not depend on the noisy ones, and the
  # unused tail of the cache stays zero.
  for (k1, v1), (k2, v2) in zip(cache, clean):
    np.testing.assert_allclose(k1, k2, atol=1e-5)
    np.testing.assert_allclose(v1, v2, atol=1e-5)
    k1 = np.abs(k1)
    assert k1[:, :, L:].max() == 0.0 and k1[:, :, :L].max(-1).min() > 0.0


def test_time_conditioned_cache_and_flash_path():
  """adaLN blocks and the Pallas (interpret) attention take the same path."""
  L, bs, B = 8, 4, 1
  model = _model(bs, seed=3, time_conditioning=True, cond_dim=8)
  flash = _model(bs, seed=3, time_conditioning=True, cond_dim=8,
                 attention_impl='interpret')  # fmt: skip
  nnx.update(flash, nnx.state(model))
  x, t = _tokens(5, (B, L)), np.array([0.3], np.float32)
  z = np.where(np.arange(L) >= 5, V, x)
  tokens = np.concatenate([z, x], 1)

  @jax.jit
  def run(model, flash):
    cache = model.extend_cache(x[:, :bs], model.init_cache(B, L), 0, t)
    cached = model.block_logits(z[:, bs:], cache, bs, t)
    both_t = jax.vmap(lambda t: model(tokens, t)[:, :L])(np.stack([t, 0 * t]))
    return both_t[0], cached, flash(tokens, t)[:, :L], both_t[1]

  full, via_cache, via_flash, other_t = run(model, flash)
  np.testing.assert_allclose(via_cache, full[:, bs:], atol=1e-5)
  np.testing.assert_allclose(via_flash, full, atol=1e-5)
  assert np.abs(np.asarray(other_t - full)).max() > 1e-4


def test_block_size_override_and_model_errors():
  L = 8
  model = _model(4)
  tokens = np.concatenate([_tokens(6, (1, L))] * 2, 1)
  run = jax.jit(
    lambda m: (
      m(tokens, block_size=L)[:, :L],
      m(tokens[:, :L], block_size=0),
      m(tokens, block_size=2),
      m(tokens),
    )
  )
  one_block, plain, bs2, bs4 = run(model)
  # block_size=L makes the noisy half a plain bidirectional pass over z.
  np.testing.assert_allclose(one_block, plain, atol=1e-5)
  assert not np.allclose(bs2, bs4)
  with pytest.raises(ValueError, match='even length'):
    model(tokens[:, :7])
  with pytest.raises(ValueError, match='divides the length'):
    model(tokens, block_size=3)
  with pytest.raises(ValueError, match='causal=False'):
    TransformerConfig(V, V + 1, block_size=2, causal=True)
  with pytest.raises(ValueError, match='block_size'):
    TransformerConfig(V, V + 1, block_size=-1)
  with pytest.raises(ValueError, match='does not fit'):
    model.block_logits(tokens[:, :4], ((np.zeros((1, 2, 8, 8)),) * 2,), 6)
  # A state-space layer would carry the clean half into the noisy one.
  hcfg = hybrid.HybridConfig(dataclasses.replace(model.cfg, depth=2), 'AS')
  net = nnx.eval_shape(lambda: hybrid.HybridTransformer(hcfg, rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match='attention-only'):
    net(tokens)
  with pytest.raises(ValueError, match='attention-only'):
    net.init_cache(1, 8)


# --------------------------------------------------------------- process --


def _process(block_size, **kw):
  return BlockDiffusion(get_schedule('loglinear'), V, block_size, **kw)


def test_one_block_is_masked_diffusion_on_the_same_network():
  L, B = 8, 3
  model = _model(L, seed=4)
  x = _tokens(7, (B, L))
  pad = np.ones((B, L), np.float32)
  pad[0, 6:] = 0.0
  block = _process(L)
  # BD3 keeps MDLM's convention (no prior term), as its paper reports.
  masked = MaskedDiffusion(
    get_schedule('loglinear'), V, t_min=1e-3, bound_kind='mdlm'
  )
  plain = lambda z, t: model(z, t, block_size=0)
  losses = lambda k: (
    block.loss(model, k, x, pad),
    masked.loss(plain, k, x, pad),
  )
  got, want = jax.jit(
    lambda: jax.vmap(losses)(jax.random.split(jax.random.key(0), 3))
  )()
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
  np.testing.assert_allclose(got[2]['t'], want[2]['t'], rtol=1e-6)


def test_one_token_blocks_give_the_ar_likelihood():
  """E_{t, z}[NELBO] for L' = 1 is c * (AR NLL) + MD4's constant, exactly.

  With one token per block, block b's term is w(t) 1[z_b = m] CE_b and CE_b
  only sees x_<b, so E_z = (1 - alpha(t)) w(t) CE_b = -alpha'(t) CE_b and
  E_t over U[lo, 1] gives c = (alpha(lo) - alpha(1)) / (1 - lo). The
  expectation over z is exact (all 2^L masks) and over t Gauss-Legendre
  (the integrand is smooth; 24 nodes leave ~1e-12). The AR NLL comes from
  the KV cache: one token at a time.
  """
  L = 4
  model = _model(1, seed=5)
  x_1xL = _tokens(8, (1, L))
  masks = np.array(list(itertools.product([0, 1], repeat=L)), bool)  # [P, L]
  x_PxL = np.repeat(x_1xL, len(masks), 0)
  z_PxL = np.where(masks, V, x_PxL)

  @jax.jit
  def run(model):
    process = _process(1)
    logits = process.denoiser_logits(
      model, z_PxL, x_PxL, jnp.full((len(masks), L), 0.5)
    )

    def next_token(b, carry):
      cache, nll = carry
      step = model.block_logits(jnp.full((1, 1), V), cache, b)
      x_b = jax.lax.dynamic_slice_in_dim(x_1xL, b, 1, 1)
      nll -= jnp.sum(jax.nn.log_softmax(step[0, 0]) * jax.nn.one_hot(x_b, V))
      return model.extend_cache(x_b, cache, b), nll

    init = (model.init_cache(1, L), jnp.float32(0.0))
    return logits, jax.lax.fori_loop(0, L, next_token, init)[1]

  logits, ar_nll = run(model)
  nodes, weights = np.polynomial.legendre.leggauss(24)
  for schedule, t_min in (('loglinear', 0.0), ('cosine', 1e-3)):
    sched = get_schedule(schedule)
    process = BlockDiffusion(sched, V, 1, t_min=t_min)
    lo = process.band[0]
    t_Q = (lo + (1 - lo) * (nodes + 1) / 2).astype(np.float32)
    nelbo_QxP = jax.jit(
      jax.vmap(
        lambda t, p=process: p.bound(
          logits,
          x_PxL,
          z_PxL,
          jnp.full((16, L), t),
          p.schedule.weight(jnp.full((16, L), t)),
        )[1]
      )
    )(t_Q)
    a = lambda t, s=sched: np.asarray(s.alpha(np.float32(t)), np.float64)
    alpha_Qx1x1 = a(t_Q)[:, None, None]
    prob_QxP = np.prod(np.where(masks, 1 - alpha_Qx1x1, alpha_Qx1x1), -1)
    expected = np.sum(weights / 2 * np.sum(prob_QxP * nelbo_QxP, -1))
    c = (a(lo) - a(1.0)) / (1 - lo)
    const = L * (1 - a(0.0)) * math.log(V)
    np.testing.assert_allclose(
      expected, c * float(ar_nll) + const, rtol=2e-5, err_msg=schedule
    )


def test_vectorised_pass_equals_the_per_block_loop():
  L, bs, B = 8, 2, 3
  model = _model(bs, seed=6)
  process = _process(bs, clip=(0.2, 0.9))
  x = _tokens(9, (B, L))
  pad = np.ones((B, L), np.float32)
  pad[1, 5:] = 0.0
  both = lambda k: (
    process.loss(model, k, x, pad),
    process.loss_per_block_reference(model, k, x, pad),
  )
  got, ref = jax.jit(
    lambda: jax.vmap(both)(jax.random.split(jax.random.key(10), 2))
  )()
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
  np.testing.assert_allclose(got[1], ref[1], rtol=1e-5)
  np.testing.assert_allclose(got[0], got[1])
  # simple_ce: the same bound, trained on the unweighted masked CE.
  logits = np.random.default_rng(1).normal(size=(B, L, V)).astype(np.float32)
  z = np.where(np.arange(L) % 3 == 0, V, x)
  t = np.full((B, L // bs), 0.5, np.float32)
  w = _process(bs).schedule.weight(t)  # -alpha'/(1 - alpha) at each block
  objective, nelbo, elbo_nelbo = jax.jit(
    lambda: (
      *_process(bs, loss_type='simple_ce').bound(logits, x, z, t, w, pad)[:2],
      _process(bs).bound(logits, x, z, t, w, pad)[1],
    )
  )()
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce_BxL = -np.take_along_axis(logp, x[..., None], -1)[..., 0]
  np.testing.assert_allclose(
    objective, (ce_BxL * (z == V) * pad).sum(-1), rtol=1e-5
  )
  np.testing.assert_allclose(nelbo, elbo_nelbo)
  np.testing.assert_allclose(nelbo, 2 * objective, rtol=1e-6)  # w = 1/t = 2


def test_times_are_stratified_per_block_and_masks_follow_them():
  process = _process(4, clip=(0.2, 0.6))
  t_BxNb = np.tile(np.array([[0.05, 0.5, 0.9, 1.0]], np.float32), (512, 1))
  t, z = jax.jit(
    lambda: (
      process.sample_times(jax.random.key(0), 3, 5),
      process.corrupt(jax.random.key(1), jnp.zeros((512, 16), int), t_BxNb),
    )
  )()
  t = np.asarray(t)
  assert t.shape == (3, 5)
  u = np.sort((t.ravel() - 0.2) / 0.4)
  np.testing.assert_allclose(np.diff(u), 1 / 15, atol=1e-6)  # antithetic
  assert t.min() >= 0.2 and t.max() <= 0.6
  # Each sequence spans the band: its blocks sit in strata 3 apart.
  assert np.all(t.max(1) - t.min(1) > 0.4 * 11 / 15)
  # corrupt masks block b at 1 - alpha(t_b): 2048 tokens per block, so each
  # fraction is within 5 standard deviations (<= 0.056) of its rate.
  frac = np.asarray((z == V).reshape(512, 4, 4).mean(axis=(0, 2)))
  np.testing.assert_allclose(frac, 0.999 * np.array([0.05, 0.5, 0.9, 1.0]),
                             atol=0.056)  # fmt: skip


def test_clip_search_picks_the_least_variance_band():
  """A uniform denoiser: NELBO/token = (log V / L) sum_b K_b / t_b.

  K_b ~ Bin(L', p t_b) (p = 1 - eps) has E[K_b / t_b | t_b] = L' p for every
  t_b, so the variance is E_t[L' p (1 - p t) / t] per block:
  nb L' p (E[1/t] - p) with E[1/t] = log(hi / lo) / (hi - lo). The band
  [0.5, 1] has the least; 512 draws estimate each variance to ~8%.
  """
  L, bs = 16, 4
  process = _process(bs)
  zeros = lambda tokens, t, block_size: jnp.zeros(tokens.shape + (V,))
  batches = [_tokens(20 + i, (128, L)) for i in range(4)]
  clips = [(0.0, 1.0), (0.3, 0.8), (0.5, 1.0)]
  draws = process.nelbo_draws(zeros, jax.random.key(0), batches, clips)
  p, scale = 0.999, (math.log(V) / L) ** 2
  for lo, hi in clips[1:]:
    inv_t = math.log(hi / lo) / (hi - lo)
    want = scale * (L // bs) * bs * p * (inv_t - p)
    np.testing.assert_allclose(np.var(draws[(lo, hi)], ddof=1), want, rtol=0.3)
  assert select_clip(draws) == (0.5, 1.0)
  assert process.clip_search(zeros, jax.random.key(0), batches, clips) == (
    0.5,
    1.0,
  )
  assert select_clip({(0.0, 1.0): [1.0, 3.0], (0.1, 0.9): [2.0, 2.5]}) == (
    0.1,
    0.9,
  )
  with pytest.raises(ValueError, match='at least two'):
    select_clip({(0.0, 1.0): [1.0]})


def test_derived_processes():
  process = _process(4, clip=(0.3, 0.8), t_min=1e-2)
  ev = process.evaluation_process
  assert ev.clip == (0.0, 1.0) and ev.block_size == 4 and ev.t_min == 1e-2
  assert ev.band == (1e-2, 1.0) and process.band == (0.3, 0.8)
  inner = process.masked_process
  assert isinstance(inner, MaskedDiffusion) and inner.t_min == 1e-2
  assert (process.mask_id, process.input_vocab_size) == (V, V + 1)
  assert process.family == 'block' and not process.causal
  hash(BlockDiffusion(get_schedule('loglinear'), V, 2, clip=[0.1, 0.5]))


def test_bad_input_raises_before_compute():
  x = np.zeros((2, 6), np.int32)
  model = lambda *a, **k: pytest.fail('the network must not be called')
  with pytest.raises(ValueError, match='divides the length'):
    _process(4).loss(model, jax.random.key(0), x)
  with pytest.raises(ValueError, match='divides the length'):
    _process(8).check_length(6)
  with pytest.raises(ValueError, match='block_size'):
    _process(0)
  with pytest.raises(ValueError, match='clip'):
    _process(2, clip=(0.8, 0.3))
  with pytest.raises(ValueError, match='loss_type'):
    _process(2, loss_type='mse')
  with pytest.raises(ValueError, match='loss_mask'):
    _process(2).loss(model, jax.random.key(0), x, np.ones((2, 5)))
