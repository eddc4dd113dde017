"""One-shot device check: kernels against references, attention, MFU, sampler.

  python -m experiments.benchmarks.device_check --out=DIR [--tiny]

Writes DIR/device_check.json and DIR/device_check.md (the short table, also
printed) with, on the default backend:

1. kernels: every attention backend x mask kind and every scan impl against
   its reference on this device, forward and backward (max abs error and
   the error relative to the reference's largest value);
2. matmul peak: the best FLOP/s of a square bf16 (and f32, which GPUs run
   as TF32 by default) matmul, measured in this run, the denominator of the
   utilisation below;
3. train step (set up and timed by train_step.build_train_step and
   time_calls): tokens/s and model-FLOP utilisation (3 x the forward FLOPs
   of ddlm_jax.evaluation.cost.transformer_flops per step, over the bf16
   peak) of a GPT-2-small-sized MDLM (width 768, 12 layers, 12 heads, L
   1024, GPT-2's 50257 tokens, bf16 compute, AdamW);
4. attention: forward+backward milliseconds of each backend x mask kind at
   L = 1k, 4k, 16k, bf16, head dim 64 and 128 (16k tokens per call: batch
   16k / L; 1024 channels: 16 or 8 heads), with each backend's speed-up
   over 'xla';
5. sampler: tokens/s of the cached ancestral sampler (the train step's
   model with a random output head, 128 steps, batch 8 x 1024);
6. scans: the PD scan's impls (sequential reference, associative XLA,
   Pallas where it lowers) and a dense-transition associative scan.
7. with --plan: the planner (ddlm_jax.training.plan, what --mode=plan
   runs) on the train step's model, compiled for the host CPU and for
   this device, then run here: planned, compiled and measured peak memory
   and FLOPs, and the step time against the planned one (this section's
   time is added to --budget_s).

A backend the platform cannot run is skipped with the reason in the JSON
(`pallas_kernels.attention.api.unsupported_reason`, behind `supported_impls`,
where present; else the error of trying), and a row for 'auto' reuses the row
of the impl it resolves to (`api.auto_impl`). Any other error is recorded and
the check goes on. Every section has a time budget (--budget_s in all, 300 s
by default, so the run with start-up stays under 6 minutes on one GPU); what
does not fit is listed as skipped for time. --tiny shrinks every size so that
the same code runs on a CPU in about 40 s of CPU time
(tests/test_device_check.py).

The targets it reports (on one H200-class GPU): train step MFU >= 45% in
bf16; 'pallas' >= 1.5x faster than 'xla' for block-causal masks at L >=
4096; 'auto' never slower than 'xla' (within 5% timing noise).

Imports only jax, flax, optax, orbax, numpy and suite modules that need none
of grain, ml_collections or tensorflow_datasets (the GPU machine has none;
the test blocks them).

On the lent GPU (the device tool copies the working tree; nothing to carry,
no pip there):

  run(command='XLA_PYTHON_CLIENT_MEM_FRACTION=.9 timeout 420 python -m '
      'experiments.benchmarks.device_check --out=$OUT', carry=[],
      timeout_s=480)

With --plan (the GPT-2-sized step built and compiled for the device and
for the host CPU, then run: 79 s for one device build and one CPU build
on the H200 host, 2026-12-04, so allow about 3 minutes) use `timeout 560`
and timeout_s=600.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform as platform_lib
import sys
import time
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import MaskSpec, attention, linear_scan, pd_scan
from pallas_kernels.benchmarks._timing import median_ms, table

# Imported inside the functions that need them (keeps --help instant); the
# test imports each with grain, ml_collections and tfds blocked.
LAZY_IMPORTS = (
  'flax.nnx',
  'ddlm_jax.diffusion',
  'ddlm_jax.evaluation.cost',
  'ddlm_jax.models',
  'ddlm_jax.parallel',
  'ddlm_jax.sampling.registry',
  'ddlm_jax.training.optimizer',
  'ddlm_jax.training.plan',
  'ddlm_jax.training.state',
  'ddlm_jax.training.steps',
  'pallas_kernels.attention.api',
  'experiments.benchmarks.train_step',
)
IMPLS = ('xla', 'cudnn', 'splash', 'pallas', 'interpret', 'auto')

SCAN_IMPLS = ('xla', 'pallas', 'interpret', 'auto')
# Largest error relative to max |reference| that counts as agreement: bf16
# keeps 8 bits (2^-9 ~ 2e-3 per rounding, a few roundings per output); f32
# matmuls on GPU default to TF32 (10 bits).
REL_TOL = {'bfloat16': 3e-2, 'float16': 1e-2, 'float32': 5e-3}
AUTO_SLACK = 1.05  # 'auto' may be this much slower than 'xla' (noise).
MASK_NAMES = (
  'full',
  'full+padding',
  'causal',
  'block_causal',
  'prefix_lm',
  'block_diffusion',
  'segments',
  'groups',
)


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Every size the check uses; `tiny()` for CPU tests."""

  check_len: int = 512
  check_heads: int = 4
  check_dim: int = 64
  check_masks: tuple[str, ...] = MASK_NAMES
  interpret_masks: tuple[str, ...] = MASK_NAMES
  check_dtypes: tuple[str, ...] = ('float32', 'bfloat16')
  # Timed mask kinds, most important first (the budget may cut the tail).
  time_masks: tuple[str, ...] = (
    'block_causal',
    'full',
    'causal',
    'block_diffusion',
    'segments',
  )
  lengths: tuple[int, ...] = (1024, 4096, 16384)
  head_dims: tuple[int, ...] = (64, 128)
  channels: int = 1024  # heads x head dim of the timed attention
  tokens: int = 16384  # batch x length of the timed attention
  block: int = 256  # block_causal / block_diffusion block size
  width: int = 768
  depth: int = 12
  heads: int = 12
  seq_len: int = 1024
  batch: int = 16
  vocab: int = 50257
  sample_batch: int = 8
  sample_steps: int = 128
  scan_batch: int = 8
  scan_len: int = 4096
  scan_state: int = 16
  peak_n: int = 8192
  repeats: int = 5

  @classmethod
  def tiny(cls) -> Sizes:
    return cls(
      check_len=32,
      check_heads=2,
      check_dim=16,
      check_masks=('block_causal', 'groups'),
      interpret_masks=('block_causal',),
      check_dtypes=('float32',),
      time_masks=('block_causal', 'full'),
      lengths=(32,),
      head_dims=(16,),
      channels=32,
      tokens=64,
      block=8,
      width=32,
      depth=1,
      heads=2,
      seq_len=32,
      batch=2,
      vocab=64,
      sample_batch=2,
      sample_steps=4,
      scan_batch=1,
      scan_len=32,
      scan_state=4,
      peak_n=128,
      repeats=2,
    )


class Budget:
  """Wall-clock budget: a global deadline and one per section."""

  def __init__(self, total_s: float):
    self.end = time.monotonic() + total_s
    self.section_end = self.end

  def section(self, seconds: float):
    self.section_end = min(self.end, time.monotonic() + seconds)

  def left(self) -> float:
    return self.section_end - time.monotonic()


def _error(err: BaseException) -> str:
  text = str(err).strip().splitlines()
  return f'{type(err).__name__}: {text[0][:300] if text else ""}'


def _platform() -> str:
  backend = jax.default_backend()
  return {'cuda': 'gpu', 'rocm': 'gpu'}.get(backend, backend)


def _bf16():
  return jnp.bfloat16


# ----------------------------------------------------------- attention ----


def attention_masks(B: int, L: int, block: int) -> dict[str, MaskSpec]:
  """One mask of every kind (plus key padding) for a [B, L] call."""
  seg_BxL = jnp.asarray(np.repeat(np.arange(4), L // 4)[None].repeat(B, 0))
  vis = np.eye(4, dtype=bool)
  vis[:, 0] = True  # Every group also sees group 0 (a shared prompt).
  valid_BxL = jnp.asarray(np.arange(L)[None].repeat(B, 0) < (3 * L) // 4)
  block = min(block, L // 2)
  return {
    'full': MaskSpec.full(),
    'full+padding': MaskSpec.full(valid_BxL),
    'causal': MaskSpec.causal(),
    'block_causal': MaskSpec.block_causal(block),
    'prefix_lm': MaskSpec.prefix_lm(L // 2),
    'block_diffusion': MaskSpec.block_diffusion(block // 2, L // 2),
    'segments': MaskSpec.segments(seg_BxL),
    'groups': MaskSpec.groups(seg_BxL, jnp.asarray(vis[None].repeat(B, 0))),
  }


def _supported(mask, q_shape, k_shape, dtype) -> Callable[[str], str | None]:
  """impl -> why it cannot run here (None: it can, or no way to know)."""
  reason = getattr(_api(), 'unsupported_reason', None)
  platform = _platform()

  def why(impl: str) -> str | None:
    if impl == 'auto' or reason is None:
      if impl in ('pallas', 'splash') and platform == 'cpu':
        return f'{impl} lowers for accelerators only, not for cpu'
      return None
    try:
      return reason(
        impl, mask, platform, q_shape=q_shape, k_shape=k_shape, dtype=dtype
      )
    except (ValueError, TypeError) as err:
      return _error(err)

  return why


def _api():
  try:
    from pallas_kernels.attention import api
  except ImportError:  # pragma: no cover - an older package layout.
    return None
  return api


def _auto_choice(mask, q_shape, k_shape, dtype) -> str | None:
  """The impl 'auto' runs for this call, where the package says."""
  auto_impl = getattr(_api(), 'auto_impl', None)
  if auto_impl is None:
    return None
  try:
    return auto_impl(
      mask, _platform(), q_shape=q_shape, k_shape=k_shape, dtype=dtype
    )
  except (ValueError, TypeError):
    return None


def _attention_loss(impl, mask):
  def loss(q, k, v, ct):
    out = attention(q, k, v, mask=mask, impl=impl)
    return jnp.sum(out.astype(jnp.float32) * ct), out

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def _qkv(key, B, H, L, D, dtype, kv_heads=None):
  kq, kk, kv, kc = jax.random.split(key, 4)
  K = kv_heads or H
  q = jax.random.normal(kq, (B, H, L, D), jnp.float32).astype(dtype)
  k = jax.random.normal(kk, (B, K, L, D), jnp.float32).astype(dtype)
  v = jax.random.normal(kv, (B, K, L, D), jnp.float32).astype(dtype)
  ct = jax.random.normal(kc, (B, H, L, D), jnp.float32)
  return q, k, v, ct


def _max_err(got, want) -> tuple[float, float]:
  # Complex scans compare as complex; bf16 as float32.
  as_np = lambda x: np.asarray(
    x, np.complex64 if jnp.iscomplexobj(x) else np.float32
  )
  got = [as_np(g) for g in jax.tree.leaves(got)]
  want = [as_np(w) for w in jax.tree.leaves(want)]
  err = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
  scale = max(float(np.max(np.abs(w))) for w in want)
  return err, err / max(scale, 1e-30)


def check_attention(sizes: Sizes, budget: Budget) -> list[dict]:
  """Every backend x mask kind vs impl='reference', forward and backward.

  'interpret' (the TPU kernel's interpreter, platform-independent numerics)
  is checked in float32 only; 'auto' reuses the row of the impl it resolves
  to when the package says which.
  """
  rows = []
  B, H, L, D = 1, sizes.check_heads, sizes.check_len, sizes.check_dim
  masks = attention_masks(B, L, sizes.block)
  for name in sizes.check_dtypes:
    dtype = jnp.dtype(name)
    q, k, v, ct = _qkv(jax.random.key(0), B, H, L, D, dtype, kv_heads=H // 2)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    for mask_name in sizes.check_masks:
      mask = masks[mask_name]
      base = dict(kernel='attention', case=mask_name, dtype=name)
      if budget.left() <= 0:
        rows += [{**base, 'impl': i, 'skipped': 'time budget'} for i in IMPLS]
        continue
      try:
        (_, want_out), want_grads = _attention_loss('reference', mask)(*f32, ct)
      except Exception as err:  # noqa: BLE001 - recorded, check goes on.
        rows.append({**base, 'impl': 'reference', 'error': _error(err)})
        continue
      why = _supported(mask, q.shape, k.shape, dtype)
      done = {}
      for impl in IMPLS:
        row = {**base, 'impl': impl}
        choice = _auto_choice(mask, q.shape, k.shape, dtype)
        if impl == 'auto' and choice in done:
          rows.append({**done[choice], 'impl': 'auto', 'resolves_to': choice})
          continue
        reason = why(impl)
        if impl == 'interpret' and name != 'float32':
          reason = 'interpreter checked in float32 only'
        if impl == 'interpret' and mask_name not in sizes.interpret_masks:
          reason = 'interpreter not checked on this mask (--tiny)'
        if budget.left() <= 0:
          reason = 'time budget'
        if reason:
          rows.append({**row, 'skipped': reason})
          continue
        try:
          (_, out), grads = _attention_loss(impl, mask)(q, k, v, ct)
          row.update(_errors(out, want_out, grads, want_grads, name))
        except Exception as err:  # noqa: BLE001
          row['error'] = _error(err)
        done[impl] = row
        rows.append(row)
  return rows


def _row(kernel, case, impl, dtype, **more) -> dict:
  return dict(kernel=kernel, case=case, impl=impl, dtype=dtype, **more)


def _errors(out, want_out, grads, want_grads, dtype: str) -> dict:
  fwd, fwd_rel = _max_err(out, want_out)
  bwd, bwd_rel = _max_err(grads, want_grads)
  tol = REL_TOL[dtype]
  return {
    'fwd_max_abs_err': fwd,
    'fwd_rel_err': fwd_rel,
    'bwd_max_abs_err': bwd,
    'bwd_rel_err': bwd_rel,
    'rel_tol': tol,
    'ok': bool(fwd_rel <= tol and bwd_rel <= tol),
  }


# ---------------------------------------------------------------- scans ----


def _scan_inputs(sizes: Sizes, key):
  B, L, N = sizes.scan_batch, sizes.scan_len, sizes.scan_state
  k1, k2, k3, k4, k5 = jax.random.split(key, 5)
  mag = jax.random.uniform(k1, (B, L, N), minval=0.5, maxval=0.99)
  phase = jax.random.uniform(k2, (B, L, N), maxval=2 * math.pi)
  d = (mag * jnp.exp(1j * phase)).astype(jnp.complex64)
  b = (
    jax.random.normal(k3, (B, L, N)) + 1j * jax.random.normal(k4, (B, L, N))
  ).astype(jnp.complex64)
  p = jax.random.randint(k5, (B, L, N), 0, N).astype(jnp.int32)
  return p, d, b


def _scan_fn(kind: str, impl: str):
  def loss(d, b, p):
    if kind == 'pd_scan':
      h, _ = pd_scan(p, d, b, impl=impl)
    else:
      h, _ = linear_scan(d, b, impl=impl)
    return jnp.sum(jnp.real(h) + 0.5 * jnp.imag(h)), h

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _scan_skip(impl: str) -> str | None:
  if impl == 'pallas' and _platform() == 'cpu':
    return "pallas lowers for accelerators only; on cpu it is 'interpret'"
  return None


def check_scans(sizes: Sizes, budget: Budget) -> list[dict]:
  """linear_scan and pd_scan impls vs impl='reference' (sequential)."""
  rows = []
  p, d, b = _scan_inputs(sizes, jax.random.key(1))
  for kind in ('linear_scan', 'pd_scan'):
    if budget.left() <= 0:
      rows += [
        _row(kind, '', i, 'complex64', skipped='time budget')
        for i in SCAN_IMPLS
      ]
      continue
    (_, want), want_grads = _scan_fn(kind, 'reference')(d, b, p)
    for impl in SCAN_IMPLS:
      row = _row(kind, f'complex64 N={sizes.scan_state}', impl, 'complex64')
      reason = 'time budget' if budget.left() <= 0 else _scan_skip(impl)
      if reason:
        rows.append({**row, 'skipped': reason})
        continue
      try:
        (_, got), grads = _scan_fn(kind, impl)(d, b, p)
        row.update(_errors(got, want, grads, want_grads, 'float32'))
      except Exception as err:  # noqa: BLE001
        row['error'] = _error(err)
      rows.append(row)
  return rows


def dense_associative(A_BxLxNxN, b_BxLxN):
  """The same recurrence with dense N x N transitions (O(N^3) combines)."""

  def combine(earlier, later):
    A_i, b_i = earlier
    A_j, b_j = later
    return A_j @ A_i, jnp.einsum('...ij,...j->...i', A_j, b_i) + b_j

  _, h = jax.lax.associative_scan(combine, (A_BxLxNxN, b_BxLxN), axis=1)
  return h


def time_scans(sizes: Sizes, budget: Budget) -> list[dict]:
  """PD scan impls (fwd+bwd) and a dense-transition associative scan."""
  rows = []
  p, d, b = _scan_inputs(sizes, jax.random.key(2))
  shape = f'B={sizes.scan_batch} L={sizes.scan_len} N={sizes.scan_state}'
  for impl in ('reference', 'xla', 'pallas'):
    row = {'op': 'pd_scan fwd+bwd', 'impl': impl, 'shape': shape}
    reason = 'time budget' if budget.left() <= 0 else _scan_skip(impl)
    if reason:
      rows.append({**row, 'skipped': reason})
      continue
    try:
      row['ms'] = median_ms(_scan_fn('pd_scan', impl), d, b, p, repeats=3)
    except Exception as err:  # noqa: BLE001
      row['error'] = _error(err)
    rows.append(row)
  row = {'op': 'dense associative fwd+bwd', 'impl': 'xla', 'shape': shape}
  if budget.left() <= 0:
    rows.append({**row, 'skipped': 'time budget'})
    return rows
  try:
    n = sizes.scan_state

    def dense_loss(d, b):
      # A[..., i, j] = d[j] where p[j] == i: the PD transition, densely.
      onehot_JxI = jax.nn.one_hot(p, n, dtype=d.dtype)
      A = jnp.swapaxes(onehot_JxI, -1, -2) * d[..., None, :]
      return jnp.sum(jnp.real(dense_associative(A, b)))

    dense = jax.jit(jax.grad(dense_loss, argnums=(0, 1)))
    row['ms'] = median_ms(dense, d, b, repeats=3)
  except Exception as err:  # noqa: BLE001
    row['error'] = _error(err)
  rows.append(row)
  return rows


# ------------------------------------------------------ matmul peak --------


def matmul_peak(n: int, dtype, repeats: int) -> float:
  """Best FLOP/s of an n x n x n matmul of `dtype`."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a, b: a @ b)
  jax.block_until_ready(f(a, b))
  best = math.inf
  for _ in range(max(repeats, 3)):
    t0 = time.perf_counter()
    jax.block_until_ready(f(a, b))
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


# ------------------------------------------------------ attention timing ---


def time_attention(sizes: Sizes, budget: Budget) -> list[dict]:
  """fwd+bwd ms of every backend x mask kind x length x head dim (bf16).

  Mask kinds in `sizes.time_masks` order (block-causal first: the kernel
  target), so a tight budget cuts the least important rows. 'auto' reuses
  the time of the impl it resolves to when the package says which.
  """
  rows = []
  for mask_name in sizes.time_masks:
    for L in sizes.lengths:
      for D in sizes.head_dims:
        H = max(1, sizes.channels // D)
        B = max(1, sizes.tokens // L)
        base = dict(mask=mask_name, L=L, D=D, H=H, B=B)
        if budget.left() <= 0:
          rows += [{**base, 'impl': i, 'skipped': 'time budget'} for i in IMPLS]
          continue
        q, k, v, ct = _qkv(jax.random.key(3), B, H, L, D, _bf16())
        mask = attention_masks(B, L, sizes.block)[mask_name]
        why = _supported(mask, q.shape, k.shape, _bf16())
        choice = _auto_choice(mask, q.shape, k.shape, _bf16())
        done = {}
        for impl in IMPLS:
          row = {**base, 'impl': impl}
          if impl == 'auto' and choice in done:
            rows.append({**done[choice], 'impl': 'auto', 'resolves_to': choice})
            continue
          reason = why(impl)
          if impl == 'interpret':
            reason = "an interpreter's time says nothing about a device"
          if budget.left() <= 0:
            reason = 'time budget'
          if reason:
            rows.append({**row, 'skipped': reason})
            continue
          try:
            fn = _attention_loss(impl, mask)
            row['ms'] = median_ms(fn, q, k, v, ct, repeats=sizes.repeats)
          except Exception as err:  # noqa: BLE001
            row['error'] = _error(err)
          done[impl] = row
          rows.append(row)
  _speedups(rows)
  return rows


def _speedups(rows: list[dict]):
  xla = {
    (r['mask'], r['L'], r['D']): r['ms']
    for r in rows
    if r['impl'] == 'xla' and 'ms' in r
  }
  for r in rows:
    base = xla.get((r['mask'], r['L'], r['D']))
    if base and 'ms' in r:
      r['speedup_vs_xla'] = base / r['ms']


# ------------------------------------------------------ train step, sampler


def _model(sizes: Sizes, attention_impl: str):
  from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
  from ddlm_jax.models import TransformerConfig

  cfg = TransformerConfig(
    vocab_size=sizes.vocab,
    input_vocab_size=sizes.vocab + 1,
    width=sizes.width,
    depth=sizes.depth,
    num_heads=sizes.heads,
    dtype='bfloat16',
    attention_impl=attention_impl,
  )
  process = MaskedDiffusion(get_schedule('loglinear'), sizes.vocab, t_min=1e-3)
  return cfg, process


def time_train_step(
  sizes: Sizes, budget: Budget, peak: float, attention_impl: str
) -> dict:
  """tokens/s and MFU of an AdamW step of the bf16 MDLM.

  The set-up and the timed calls are train_step.py's (one code path).
  """
  from ddlm_jax.evaluation.cost import transformer_flops
  from experiments.benchmarks.train_step import build_train_step, time_calls

  cfg, process = _model(sizes, attention_impl)
  bench = build_train_step(
    cfg,
    process,
    batch=sizes.batch,
    length=sizes.seq_len,
    learning_rate=3e-4,
  )
  compile_s = bench.compile_s
  jax.block_until_ready(bench.step())
  times, loss = time_calls(
    bench.step,
    max_n=max(sizes.repeats, 3),
    min_n=2,
    more=lambda: budget.left() > 0,
  )
  step_s = float(np.median(times))
  tokens = sizes.batch * sizes.seq_len
  model_flops = 3.0 * transformer_flops(cfg, sizes.batch, sizes.seq_len)
  params = bench.params
  return {
    'width': cfg.width,
    'depth': cfg.depth,
    'heads': cfg.num_heads,
    'seq_len': sizes.seq_len,
    'batch': sizes.batch,
    'vocab': sizes.vocab,
    'params': params,
    'attention_impl': attention_impl,
    'dtype': 'bfloat16',
    'compile_s': compile_s,
    'steps_timed': len(times),
    'step_ms': 1e3 * step_s,
    'tokens_per_sec': tokens / step_s,
    'model_tflops_per_step': model_flops / 1e12,
    'model_tflops_per_sec': model_flops / step_s / 1e12,
    'mfu': model_flops / step_s / peak,
    'final_loss_finite': bool(np.isfinite(float(loss))),
  }


def time_sampler(sizes: Sizes, budget: Budget, attention_impl: str) -> dict:
  """Cached ancestral sampling tokens/s (random model, random head)."""
  from flax import nnx

  from ddlm_jax.models import Transformer
  from ddlm_jax.sampling.registry import get_sampler

  del budget  # One compiled call and two timed ones.
  cfg, process = _model(sizes, attention_impl)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)
  head = params['head']['kernel']
  params['head']['kernel'] = jax.random.normal(jax.random.key(1), head.shape)
  params['head']['kernel'] *= head.shape[0] ** -0.5
  sampler = get_sampler('ancestral', num_steps=sizes.sample_steps)
  shape = dict(batch=sizes.sample_batch, length=sizes.seq_len)

  @jax.jit
  def sample(params, key):
    net = nnx.merge(graphdef, params)
    return sampler(lambda z, t: net(z, t), key, process, **shape)

  t0 = time.perf_counter()
  jax.block_until_ready(sample(params, jax.random.key(0)))
  compile_s = time.perf_counter() - t0
  best, nfe = math.inf, 0
  for i in range(2):
    t1 = time.perf_counter()
    tokens, n = sample(params, jax.random.key(1 + i))
    jax.block_until_ready(tokens)
    best = min(best, time.perf_counter() - t1)
    nfe = int(np.sum(np.asarray(n)))
  total = sizes.sample_batch * sizes.seq_len
  return {
    'sampler': 'ancestral (cached)',
    'steps': sizes.sample_steps,
    'batch': sizes.sample_batch,
    'length': sizes.seq_len,
    'nfe': nfe,
    'compile_s': compile_s,
    'seconds': best,
    'tokens_per_sec': total / best,
    'ms_per_network_call': 1e3 * best / max(nfe, 1),
  }


def plan_check(sizes: Sizes, budget: Budget, attention_impl: str) -> dict:
  """The planner against this device: mdlm_owt.py's model (the train
  step's sizes) planned on the host CPU as --mode=plan plans it, compiled
  for this device, then run here.

  Reports the planned peak memory per device (CPU compile), the peak this
  device's compiler plans, and the peak this device measured over the
  section (memory_stats; None where the backend keeps none), with the
  FLOPs of both compiles and the step time against the planner's estimate
  at its assumed MFU.
  """
  from ddlm_jax.models import Transformer
  from ddlm_jax.parallel import make_mesh
  from ddlm_jax.training import plan as plan_lib
  from ddlm_jax.training.optimizer import make_optimizer
  from experiments.benchmarks.train_step import build_train_step, time_calls

  cfg, process = _model(sizes, attention_impl)
  tx, _ = make_optimizer(learning_rate=3e-4, warmup_steps=10, total_steps=1000)

  def spec(devices):
    return plan_lib.LMSpec(
      build=lambda remat: (
        lambda rngs: Transformer(
          dataclasses.replace(cfg, remat=remat), rngs=rngs
        )
      ),
      process=process,
      tx=tx,
      mesh=make_mesh((1, 1, 1), devices[:1]),
      batch_size=sizes.batch,
      seq_len=sizes.seq_len,
      num_steps=1_000_000,
      model_config=cfg,
    )

  device = jax.devices()[0]
  stats = lambda: (device.memory_stats() or {}).get('peak_bytes_in_use')
  before = stats()
  planned = plan_lib.plan_lm(spec(jax.devices('cpu')), sections=())
  here = plan_lib.plan_lm(spec(jax.devices()), sections=())
  bench = build_train_step(
    cfg, process, batch=sizes.batch, length=sizes.seq_len, learning_rate=3e-4
  )
  jax.block_until_ready(bench.step())
  times, _ = time_calls(
    bench.step,
    max_n=max(sizes.repeats, 3),
    min_n=2,
    more=lambda: budget.left() > 0,
  )
  step_s = float(np.median(times))
  flops = planned['flops']['train_step']
  peaks = {acc.name: acc.peak_bf16 for acc in plan_lib.ACCELERATORS}
  kind = device.device_kind
  chip = next((name for name in peaks if name in kind), None)
  return {
    'model': f'{cfg.width}x{cfg.depth}, vocab {cfg.vocab_size}, bf16',
    'batch': sizes.batch,
    'seq_len': sizes.seq_len,
    'planned_peak_bytes_cpu': planned['memory_per_device']['peak'],
    'compiled_peak_bytes_here': here['memory_per_device']['peak'],
    'measured_peak_bytes_here': stats(),
    'peak_bytes_before_section': before,
    'planned_state_bytes': planned['memory_per_device']['state_params']
    + planned['memory_per_device']['state_optimizer'],
    'planned_flops_cpu': flops,
    'compiled_flops_here': here['flops']['train_step'],
    'closed_form_flops': planned['flops']['closed_form_train_step'],
    'step_ms': 1e3 * step_s,
    'planned_step_ms': 1e3 * flops / (peaks[chip] * plan_lib.ASSUMED_MFU)
    if chip
    else None,
    'assumed_mfu': plan_lib.ASSUMED_MFU,
    'mfu_at_nominal_peak': flops / step_s / peaks[chip] if chip else None,
  }


# ------------------------------------------------------------- targets ----


def targets(result: dict) -> list[dict]:
  """The issue's targets, each with the measured value and whether met."""
  out = []
  train = result.get('train_step') or {}
  if 'mfu' in train:
    out.append(
      {
        'target': 'train step MFU >= 0.45 (bf16)',
        'value': train['mfu'],
        'met': train['mfu'] >= 0.45,
      }
    )
  rows = [r for r in result.get('attention', []) if 'ms' in r]
  by = {(r['mask'], r['L'], r['D'], r['impl']): r['ms'] for r in rows}
  big = max(result['sizes']['lengths']) >= 4096
  for (mask, L, D, impl), ms in sorted(by.items()):
    xla = by.get((mask, L, D, 'xla'))
    if xla is None:
      continue
    if impl == 'pallas' and mask == 'block_causal' and (L >= 4096 or not big):
      out.append(
        {
          'target': f'pallas >= 1.5x xla, block_causal L={L} D={D}',
          'value': xla / ms,
          'met': xla / ms >= 1.5,
        }
      )
    if impl == 'auto':
      out.append(
        {
          'target': f'auto <= xla x {AUTO_SLACK}, {mask} L={L} D={D}',
          'value': ms / xla,
          'met': ms <= AUTO_SLACK * xla,
        }
      )
  return out


# ---------------------------------------------------------------- report ---


def report(result: dict) -> str:
  """The short table: errors, peak, MFU, sampler, attention, scans."""
  parts = [f'# device check: {result["device"]} ({result["backend"]})', '']
  bad = [r for r in result['kernels'] if 'error' in r or (r.get('ok') is False)]
  ran = [r for r in result['kernels'] if 'ok' in r]
  skipped = [r for r in result['kernels'] if 'skipped' in r]
  parts.append(
    f'kernels: {len(ran)} checked, {sum(r["ok"] for r in ran)} within '
    f'tolerance, {len(bad)} failed or erred, {len(skipped)} skipped'
  )
  worst = sorted(ran, key=lambda r: -max(r['fwd_rel_err'], r['bwd_rel_err']))
  rows = [
    [
      r['kernel'],
      r['case'],
      r['impl'],
      r['dtype'],
      f'{r["fwd_rel_err"]:.1e}',
      f'{r["bwd_rel_err"]:.1e}',
      'ok' if r['ok'] else 'FAIL',
    ]
    for r in worst[:6]
  ]
  rows += [
    [r['kernel'], r['case'], r['impl'], r['dtype'], '-', '-', r['error'][:60]]
    for r in bad
    if 'error' in r
  ]
  parts += [
    table(['kernel', 'case', 'impl', 'dtype', 'fwd rel', 'bwd rel', ''], rows),
    '',
  ]
  peak = result.get('matmul_peak_tflops', {})
  parts.append(
    'matmul peak: ' + ', '.join(f'{k} {v:.3g} TFLOP/s' for k, v in peak.items())
  )
  train = result.get('train_step') or {}
  if 'mfu' in train:
    parts.append(
      f'train step ({train["width"]}x{train["depth"]}, L {train["seq_len"]}, '
      f'batch {train["batch"]}, bf16, attention {train["attention_impl"]}): '
      f'{train["step_ms"]:.1f} ms, {train["tokens_per_sec"]:.0f} tok/s, '
      f'MFU {100 * train["mfu"]:.1f}%'
    )
  elif train:
    parts.append(f'train step: {train}')
  plan = result.get('plan') or {}
  if 'planned_peak_bytes_cpu' in plan:
    gib = lambda b: '-' if b is None else f'{b / 2**30:.2f}'
    parts.append(
      f'plan ({plan["model"]}, batch {plan["batch"]}): peak GiB planned '
      f'{gib(plan["planned_peak_bytes_cpu"])} (CPU), compiled here '
      f'{gib(plan["compiled_peak_bytes_here"])}, measured '
      f'{gib(plan["measured_peak_bytes_here"])}; TFLOPs/step planned '
      f'{plan["planned_flops_cpu"] / 1e12:.3g}, here '
      f'{plan["compiled_flops_here"] / 1e12:.3g}; step ms '
      f'{plan["step_ms"]:.1f} (planned '
      f'{plan["planned_step_ms"] or float("nan"):.1f} at MFU '
      f'{plan["assumed_mfu"]:.0%})'
    )
  sample = result.get('sampler') or {}
  if 'tokens_per_sec' in sample:
    parts.append(
      f'sampler {sample["sampler"]}: {sample["tokens_per_sec"]:.0f} tok/s '
      f'(T {sample["steps"]}, NFE {sample["nfe"]}, batch {sample["batch"]} x '
      f'{sample["length"]})'
    )
  elif sample:
    parts.append(f'sampler: {sample}')
  parts.append('')
  att = [r for r in result.get('attention', []) if 'ms' in r]
  impls = [i for i in IMPLS if any(r['impl'] == i for r in att)]
  keys = sorted({(r['mask'], r['L'], r['D']) for r in att})
  ms = {(r['mask'], r['L'], r['D'], r['impl']): r['ms'] for r in att}
  cell = lambda key: f'{ms[key]:.2f}' if key in ms else '-'
  rows = [[m, L, D] + [cell((m, L, D, i)) for i in impls] for m, L, D in keys]
  parts += [
    'attention fwd+bwd ms (bf16):',
    table(['mask', 'L', 'D'] + impls, rows),
    '',
  ]
  scans = result.get('scans', [])
  shown = lambda r: (
    f'{r["ms"]:.2f} ms' if 'ms' in r else r.get('skipped', r.get('error'))
  )
  parts.append(
    'scans: ' + '; '.join(f'{r["op"]} {r["impl"]} {shown(r)}' for r in scans)
  )
  tg = result.get('targets', [])
  if tg:
    parts += [
      '',
      table(
        ['target', 'value', 'met'],
        [[t['target'], f'{t["value"]:.3f}', t['met']] for t in tg],
      ),
    ]
  skipped_time = [
    name for name, s in result.get('sections', {}).items() if s != 'ok'
  ]
  if skipped_time:
    parts.append(f'\nsections not ok: {skipped_time}')
  return '\n'.join(parts)


# ------------------------------------------------------------------ main ---

# Seconds per section, as shares of --budget_s (they sum to 1).
SHARES = {
  'kernels': 0.22,
  'matmul_peak': 0.03,
  'train_step': 0.25,
  'attention': 0.33,
  'sampler': 0.09,
  'scans': 0.08,
}
# --plan's section: seconds as a share of --budget_s, added to the budget.
PLAN_SHARE = 0.4


def run(args) -> dict:
  sizes = Sizes.tiny() if args.tiny else Sizes()
  budget = Budget(args.budget_s)
  if args.plan:  # Its own time, on top of the shares of the other sections.
    budget.end += PLAN_SHARE * args.budget_s
  result = {
    'backend': jax.default_backend(),
    'device': str(jax.devices()[0].device_kind),
    'device_count': jax.device_count(),
    'jax': jax.__version__,
    'python': platform_lib.python_version(),
    'tiny': bool(args.tiny),
    'sizes': dataclasses.asdict(sizes),
    'budget_s': args.budget_s,
    'sections': {},
  }
  t_start = time.perf_counter()

  def section(name, fn, default):
    budget.section(SHARES.get(name, PLAN_SHARE) * args.budget_s)
    if budget.left() <= 0:  # Earlier sections used the whole budget.
      result['sections'][name] = 'skipped: time budget'
      return default
    t0 = time.perf_counter()
    try:
      out = fn()
      result['sections'][name] = 'ok'
    except Exception as err:  # noqa: BLE001 - recorded, check goes on.
      out = default
      result['sections'][name] = _error(err)
      traceback.print_exc()
    result.setdefault('section_seconds', {})[name] = time.perf_counter() - t0
    print(f'[device_check] {name}: {time.perf_counter() - t0:.1f}s', flush=True)
    return out

  result['kernels'] = section(
    'kernels',
    lambda: check_attention(sizes, budget) + check_scans(sizes, budget),
    [],
  )
  peaks = section(
    'matmul_peak',
    lambda: {
      name: matmul_peak(sizes.peak_n, dtype, sizes.repeats) / 1e12
      for name, dtype in (('bfloat16', _bf16()), ('float32', jnp.float32))
    },
    {},
  )
  result['matmul_peak_tflops'] = peaks
  peak = 1e12 * peaks.get('bfloat16', math.nan)
  if args.plan:
    result['plan'] = section(
      'plan', lambda: plan_check(sizes, budget, args.attention), {}
    )
  result['train_step'] = section(
    'train_step',
    lambda: time_train_step(sizes, budget, peak, args.attention),
    {},
  )
  result['attention'] = section(
    'attention', lambda: time_attention(sizes, budget), []
  )
  result['sampler'] = section(
    'sampler', lambda: time_sampler(sizes, budget, args.attention), {}
  )
  result['scans'] = section('scans', lambda: time_scans(sizes, budget), [])
  result['targets'] = targets(result)
  result['wall_s'] = time.perf_counter() - t_start
  return result


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--out', default='.', help='directory for the JSON and table')
  p.add_argument('--tiny', action='store_true', help='CPU-sized everything')
  p.add_argument('--budget_s', type=float, default=300.0)
  p.add_argument(
    '--attention', default='auto', help='attention_impl of the MDLM'
  )
  p.add_argument(
    '--plan',
    action='store_true',
    help='also plan the MDLM step (ddlm_jax.training.plan) on the host CPU '
    'and compare with this device',
  )
  args = p.parse_args(argv)
  if args.budget_s <= 0:
    raise SystemExit('--budget_s must be > 0 (seconds for the whole check).')
  os.makedirs(args.out, exist_ok=True)
  result = run(args)
  text = report(result)
  with open(os.path.join(args.out, 'device_check.json'), 'w') as f:
    json.dump(result, f, indent=1, default=str)
  with open(os.path.join(args.out, 'device_check.md'), 'w') as f:
    f.write(text + '\n')
  print(text)
  return result


if __name__ == '__main__':
  main(sys.argv[1:])
