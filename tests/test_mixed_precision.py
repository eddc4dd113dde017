"""bf16 compute, float32 parameters and float32 loss math (quickstart:smoke).

`model.dtype='bfloat16'` runs the matmuls in bfloat16 while parameters,
optimizer state, softmaxes, the log-softmax of the loss and every reduction
stay float32. The loss parity checks compile with XLA's
`xla_allow_excess_precision` off: the CPU backend otherwise keeps float32
intermediates where bf16 was asked for, which would make bf16 look more
accurate than it is on a GPU or TPU.

Tolerance of the parity: bf16 keeps 8 significant bits (unit roundoff
u = 2^-9 ~ 2e-3). Each logit then carries a relative error of a few u from
the rounded weights and activations of 2 layers, i.e. ~1e-2 absolute on
logits of spread ~1, and the per-token loss moves by about that; averaged
over the batch's 256 tokens the mean loss moves far less. Measured: 1e-4
to 2e-3 relative over 4 noise draws; allowed: 1% relative (2.5e-2 nats on
a ~4.4-nat loss). A bf16 softmax or log-softmax (errors of u on every
probability, ~1e-2 nats per token, not averaging out) or a float16 overflow
would exceed it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.tasks.language_model import Run
from ddlm_jax.training import fit
from experiments.configs import quickstart

RTOL = 1e-2
STRICT = {'xla_allow_excess_precision': False}


def _run(dtype: str, workdir) -> Run:
  c = quickstart.get_config('smoke')
  c.model.dtype = dtype
  c.mesh.shape = (1, 1, 1)
  return Run(c, str(workdir))


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  base = tmp_path_factory.mktemp('mixed')
  return _run('float32', base / 'f32'), _run('bfloat16', base / 'bf16')


@pytest.fixture(scope='module')
def built(runs):
  """The fresh train state of each run (a Run itself allocates none)."""
  return tuple(run.train_setup() for run in runs)


@pytest.fixture(scope='module')
def batch(runs):
  host = next(iter(runs[0].task().batches(0)))
  return {k: jnp.asarray(v) for k, v in host.items()}


def _random_head(params, key):
  """The parameters with a random (not zero-initialised) output head."""
  out = jax.tree.map(lambda x: x, params)
  kernel = out['head']['kernel']
  std = kernel.shape[0] ** -0.5
  out['head']['kernel'] = std * jax.random.normal(key, kernel.shape)
  return out


def _strict_loss(run, params, batch):
  """key -> the run's loss at `params`, compiled once, without excess
  precision."""
  loss = lambda p, k: run.task().loss(p, k, batch)[0]
  lowered = jax.jit(loss).lower(params, jax.random.key(0))
  compiled = lowered.compile(compiler_options=STRICT)
  return lambda p, k: float(compiled(p, k))


def _ops(jaxpr, out=None):
  """(primitive, input dtype, output dtype, output shape) of every equation,
  nested jaxprs included."""
  out = [] if out is None else out
  for eqn in jaxpr.eqns:
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          _ops(inner, out)
    if eqn.invars and eqn.outvars:
      aval_in, aval_out = eqn.invars[0].aval, eqn.outvars[0].aval
      out.append(
        (
          eqn.primitive.name,
          str(getattr(aval_in, 'dtype', '')),
          str(aval_out.dtype),
          tuple(aval_out.shape),
        )
      )
  return out


def test_bf16_keeps_float32_parameters_and_float32_loss_math(
  runs, built, batch
):
  f32, bf16 = runs
  leaves = jax.tree.leaves(built[1].state.params)
  assert all(x.dtype == jnp.float32 for x in leaves)
  opt_leaves = jax.tree.leaves(built[1].state.opt_state)
  assert all(x.dtype != jnp.bfloat16 for x in opt_leaves)
  same = jax.tree.map(
    lambda a, b: bool(jnp.array_equal(a, b)),
    built[0].state.params,
    built[1].state.params,
  )
  assert all(jax.tree.leaves(same))  # One init, whatever the compute dtype.
  loss = lambda p: bf16.task().loss(p, jax.random.key(0), batch)[0]
  ops = _ops(jax.make_jaxpr(loss)(built[1].state.params).jaxpr)
  counts = collections.Counter((name, o) for name, _, o, _ in ops)
  # The matmuls really run in bf16 ...
  assert counts[('dot_general', 'bfloat16')] >= 4 * bf16.config.model.depth
  # ... and every exp/log (attention softmax, log-softmax) and every sum or
  # max (softmax normalisers, RMS norms, the loss mean) in float32.
  float_math = ('exp', 'log', 'log1p', 'reduce_sum', 'reduce_max')
  assert [op for op in ops if op[0] in float_math and op[2] != 'float32'] == []
  assert sum(counts[(n, 'float32')] for n in ('exp', 'reduce_sum')) > 0
  tokens = batch['tokens']
  model_out = jax.eval_shape(
    lambda p: nnx.merge(bf16.graphdef, p)(tokens), built[1].state.params
  )
  assert model_out.dtype == jnp.float32  # Logits reach the loss as float32.


def test_bf16_logits_and_attention_scores_come_out_of_the_matmul_in_float32(
  runs, built, batch
):
  bf16 = runs[1]
  vocab = bf16.process.vocab_size
  b, length = batch['tokens'].shape
  heads = bf16.config.model.num_heads
  loss = lambda p: bf16.task().loss(p, jax.random.key(0), batch)[0]
  ops = _ops(jax.make_jaxpr(loss)(built[1].state.params).jaxpr)
  dots = [op for op in ops if op[0] == 'dot_general']
  logits = [op for op in dots if op[3][-1] == vocab]
  scores = [op for op in dots if op[3] == (b, heads, length, length)]
  assert logits and scores
  assert {op[2] for op in logits + scores} == {'float32'}


def test_bf16_loss_matches_float32(runs, built, batch):
  f32, bf16 = runs
  loss32 = _strict_loss(f32, built[0].state.params, batch)
  loss16 = _strict_loss(bf16, built[1].state.params, batch)
  key = jax.random.key(0)
  # At init the zero-initialised head makes every logit 0 in both dtypes:
  # the loss is the same number exactly (a check of the shared init).
  p32, p16 = built[0].state.params, built[1].state.params
  assert loss32(p32, key) == loss16(p16, key)
  params = _random_head(built[0].state.params, jax.random.key(1))
  gaps = []
  for seed in range(4):
    k = jax.random.key(10 + seed)
    want, got = loss32(params, k), loss16(params, k)
    assert math.isfinite(got)
    gaps.append(abs(got - want) / abs(want))
  print('bf16 vs float32 relative loss gaps:', gaps)
  assert max(gaps) <= RTOL, gaps
  assert max(gaps) > 0  # bf16 did round: the comparison is not vacuous.


@pytest.mark.slow  # Two train-step compiles: ~40 s on a busy 2-core host.
def test_bf16_short_run_is_finite_and_tracks_float32(
  runs, built, tmp_path, monkeypatch
):
  """The smoke run (6 AdamW steps) in both dtypes, compiled without excess
  precision: every logged bf16 loss finite and within RTOL of float32's
  (measured < 1e-4 relative), and not identical to it."""
  monkeypatch.setitem(fit.FAST_COMPILE, 'xla_allow_excess_precision', False)
  losses = []
  for run, fresh, name in zip(runs, built, ('f32', 'bf16')):
    task = dataclasses.replace(
      run.task(),
      evaluate=None,  # Training alone: no evaluation, no samples.
      cache_key=None,  # Compiled here, with the options above.
    )
    summary = fit.fit(
      task,
      dataclasses.replace(run.trainer_config, fast_compile=True),
      str(tmp_path / name),
      mesh=run.mesh,
      # A copy: the train step donates its input state.
      built=dataclasses.replace(
        fresh, state=jax.tree.map(jnp.copy, fresh.state)
      ),
    ).summary
    assert summary['status'] == 'ok' and summary['finished']
    rows = (tmp_path / name / 'metrics.jsonl').read_text().splitlines()
    records = [json.loads(r) for r in rows]
    losses.append(
      {r['step']: r['loss'] for r in records if r['split'] == 'train'}
    )
  f32_losses, bf16_losses = losses
  print('train losses f32 / bf16:', f32_losses, bf16_losses)
  assert sorted(f32_losses) == sorted(bf16_losses) and len(f32_losses) >= 3
  for step, want in f32_losses.items():
    got = bf16_losses[step]
    assert np.isfinite(got)
    assert abs(got - want) <= RTOL * abs(want), (step, got, want)
  assert f32_losses != bf16_losses  # bf16 rounded somewhere.
