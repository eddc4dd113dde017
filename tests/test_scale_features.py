"""Gradient accumulation, remat, bf16, loss masks, cross-mesh restore."""

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import Autoregressive, MaskedDiffusion, get_schedule
from ddlm_jax.evaluation import summarize_nll
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.parallel import make_mesh
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.training.checkpoint import Checkpointer
from ddlm_jax.training.steps import _grads, loss_fn
from experiments.configs import quickstart

VOCAB = 16


def _params(**kw):
  cfg = TransformerConfig(
    vocab_size=VOCAB,
    input_vocab_size=VOCAB + 1,
    width=32,
    depth=2,
    num_heads=2,
    **kw,
  )
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  head = model.head.kernel
  head[...] = 0.1 * jax.random.normal(jax.random.key(1), head.shape)
  return nnx.split(model, nnx.Param)


@pytest.fixture(scope='module')
def tokens():
  return jax.random.randint(jax.random.key(0), (8, 16), 0, VOCAB)


def test_gradient_accumulation_equals_full_batch(tokens):
  """With a deterministic loss (AR) 4 micro-batches give the same grads."""
  graphdef, params = _params(causal=True)
  proc = Autoregressive(VOCAB)
  run = jax.jit(
    functools.partial(_grads, graphdef=graphdef, process=proc),
    static_argnames='accum_steps',
  )
  batch = {'tokens': tokens}
  m1, g1 = run(params, key=jax.random.key(0), batch=batch, accum_steps=1)
  m4, g4 = run(params, key=jax.random.key(0), batch=batch, accum_steps=4)
  np.testing.assert_allclose(m1['loss'], m4['loss'], rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7),
    g1,
    g4,
  )
  with pytest.raises(ValueError, match='micro-batches'):
    run(params, key=jax.random.key(0), batch=batch, accum_steps=3)


def test_remat_gives_the_same_gradients(tokens):
  proc = MaskedDiffusion(get_schedule('loglinear'), VOCAB, t_min=1e-3)
  grads = []
  for remat in [False, True]:
    graphdef, params = _params(remat=remat)
    g = jax.jit(
      jax.grad(functools.partial(loss_fn, graphdef=graphdef, process=proc))
    )(params, jax.random.key(2), tokens)
    grads.append(g)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
    *grads,
  )


def test_remat_model_evaluates_and_samples_inside_loops(tokens):
  # Evaluation maps over draws and samplers loop over steps with the model
  # merged outside the loop: remat must not touch the outer trace.
  from ddlm_jax.evaluation.likelihood import sequence_nll
  from ddlm_jax.sampling.ancestral import ancestral_sample

  proc = MaskedDiffusion(get_schedule('loglinear'), VOCAB, t_min=1e-3)
  nll, samples = [], []
  for remat in [False, True]:
    graphdef, params = _params(remat=remat)
    nll.append(
      sequence_nll(
        params, jax.random.key(3), tokens, graphdef=graphdef, process=proc,
        samples=2,
      )
    )  # fmt: skip
    model = nnx.merge(graphdef, params)
    samples.append(
      jax.jit(
        lambda key, model=model: ancestral_sample(
          model, key, proc, batch=2, length=16, num_steps=4
        )[0]
      )(jax.random.key(4))
    )
  np.testing.assert_allclose(nll[0], nll[1], rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(samples[0]), np.asarray(samples[1]))


def test_bfloat16_compute_keeps_float32_params_and_close_loss(tokens):
  proc = Autoregressive(VOCAB)
  losses = []
  for dtype in ['float32', 'bfloat16']:
    graphdef, params = _params(causal=True, dtype=dtype)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    fn = functools.partial(loss_fn, graphdef=graphdef, process=proc)
    losses.append(float(jax.jit(fn)(params, jax.random.key(0), tokens)))
  assert abs(losses[0] - losses[1]) < 0.02 * losses[0]


def test_loss_mask_excludes_padding_from_the_bound():
  """Uniform denoiser: (1 - eps) log V per *real* token, whatever padding."""
  proc = MaskedDiffusion(get_schedule('loglinear'), VOCAB)
  batch, length = 256, 32
  x = jax.random.randint(jax.random.key(0), (batch, length), 0, VOCAB)
  lengths = jax.random.randint(jax.random.key(1), (batch,), 4, length + 1)
  mask = (jnp.arange(length)[None] < lengths[:, None]).astype(jnp.float32)
  uniform = lambda z, t: jnp.zeros(z.shape + (VOCAB,))
  nll = []
  for i in range(4):
    nll.append(np.asarray(proc.loss(uniform, jax.random.key(i), x, mask)[1]))
  summary = summarize_nll(np.concatenate(nll), np.tile(mask.sum(-1), 4))
  expect = (1 - proc.schedule.eps) * math.log(VOCAB)
  assert abs(summary['nats_per_token'] - expect) < (
    4 * summary['nats_per_token_stderr'] + 1e-4
  )
  assert summary['num_tokens'] == int(4 * mask.sum())


def test_checkpoint_saved_on_one_mesh_restores_on_another(tmp_path):
  c = quickstart.get_config('smoke')
  c.sample.num_samples = 0
  c.mesh.shape = (1, 1, 1)
  workdir = str(tmp_path)
  single = lm.Run(c, workdir)
  writer = Checkpointer(os.path.join(workdir, 'checkpoints'))
  state = single.train_setup().state
  writer.save(3, state, {'next_index': 24})
  writer.wait()
  c8 = quickstart.get_config('smoke')
  c8.mesh.shape = (2, 2, 2)
  c8.train.batch_size = 8
  sharded = lm.Run(c8, workdir)
  assert sharded.restore() == 3
  kernel = sharded.params['blocks'][0]['mlp']['up']['kernel']
  assert len(kernel.sharding.device_set) == 8
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    state.params,
    sharded.params,
  )
  writer.close()
  sharded.checkpointer.close()
  assert os.path.exists(os.path.join(workdir, 'checkpoints', '3'))


def test_make_mesh_can_use_a_subset_of_devices():
  assert make_mesh((1, 1, 1)).devices.size == 1
  assert make_mesh((2, 1, -1)).devices.size == 8
