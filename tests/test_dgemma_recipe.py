"""The DiffusionGemma recipe's process, network pass and sampler.

The bound is checked by exact enumeration on V = 3 with blocks of 2: a
random source over every sequence, its exact posterior per block (given
the clean earlier blocks) as the oracle denoiser, every noisy state z
weighted by q(z | x, t) and Gauss-Legendre quadrature over t. The oracle
with the tight schedule (alpha(0) = 1, alpha(1) = 0, t_min = 0) gives
-log p(x) for every x; any other denoiser or schedule gives a bound whose
mean under the source is above the entropy.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion.dgemma import DGemmaDiffusion, block_logits
from ddlm_jax.diffusion.schedules import LinearSchedule, LogLinearSchedule
from ddlm_jax.models.dgemma_backbone import DGemmaBackbone, run_model_config
from ddlm_jax.sampling import entropy_bound_canvas as ebc
from ddlm_jax.sampling.dgemma_canvas import (
  EntropyBoundCanvasSampler,
  fill_canvases,
)
from ddlm_jax.sampling.registry import get_sampler, samplers_for

V, C = 3, 2
TIGHT = LinearSchedule(eps=0.0)  # alpha(t) = 1 - t exactly.


def source(length: int, seed: int = 0) -> np.ndarray:
  """A random, correlated distribution over all V^length sequences."""
  logits = np.random.default_rng(seed).normal(size=V**length) * 1.5
  p = np.exp(logits - logits.max())
  return p / p.sum()


def sequences(length: int) -> np.ndarray:
  return np.array(list(itertools.product(range(V), repeat=length)), np.int32)


def q_keep(z, x, alpha):
  """q(z | x) per position: alpha 1[z = x] + (1 - alpha) / V."""
  return alpha * (z == x) + (1.0 - alpha) / V


def oracle_logits(p_S, seqs_SxL, alpha, conditional=True):
  """log p(x_b^i | z_b, x_<b) for every (x, z) pair: [S_x, S_z, L, V].

  `conditional=False` drops the clean prefix (the block's marginal under
  the source): a worse denoiser, still a function of z_b.
  """
  num, length = seqs_SxL.shape
  onehot_SxLxV = np.eye(V)[seqs_SxL]
  out = np.zeros((num, num, length, V))
  for b in range(length // C):
    lo, hi = b * C, (b + 1) * C
    # ok[x, s]: s agrees with x before the block; like[z, s] = q(z_b | s_b).
    ok_XxS = np.ones((num, num))
    if conditional:
      ok_XxS = np.all(
        seqs_SxL[:, None, :lo] == seqs_SxL[None, :, :lo], axis=-1
      ).astype(float)
    like_ZxS = np.prod(
      q_keep(seqs_SxL[:, None, lo:hi], seqs_SxL[None, :, lo:hi], alpha),
      axis=-1,
    )
    probs = np.einsum(
      'xs,zs,s,siv->xziv', ok_XxS, like_ZxS, p_S, onehot_SxLxV[:, lo:hi]
    )
    out[:, :, lo:hi] = np.log(probs / probs.sum(-1, keepdims=True))
  return out


def enumerated_bound(process, p_S, denoiser, nodes: int = 48):
  """[S] the NELBO of every sequence x: sum over z of q(z | x, t) times
  the process's bound at (x, z), integrated over t in [t_min, 1].

  `denoiser(alpha)` gives the logits of every (x, z) pair, [S, S, L, V].
  """
  length = int(round(np.log(len(p_S)) / np.log(V)))
  seqs = sequences(length)
  num, nb = len(seqs), length // C
  u, w = np.polynomial.legendre.leggauss(nodes)
  lo = process.t_min
  t_T = lo + (1.0 - lo) * (u + 1.0) / 2.0
  w_T = w * (1.0 - lo) / 2.0
  recon, prior = process.constant_nats()
  x_N = np.repeat(seqs, num, axis=0)  # (x, z) pairs, x-major.
  z_N = np.tile(seqs, (num, 1))
  totals = np.zeros(num)
  for t, wt in zip(t_T, w_T):
    alpha = float(process.schedule.alpha(t))
    weight = float(-process.schedule.dalpha(t))
    logits = denoiser(alpha).reshape(num * num, length, V)
    _, nelbo_N, _ = process.bound(
      jnp.asarray(logits, jnp.float32), jnp.asarray(x_N), jnp.asarray(z_N),
      jnp.full((num * num, nb), t, jnp.float32),
      jnp.full((num * num, nb), weight, jnp.float32),
    )  # fmt: skip
    diffusion_N = np.asarray(nelbo_N, np.float64) - (recon + prior) * length
    q_N = np.prod(q_keep(z_N, x_N, alpha), axis=1)
    totals += wt * (q_N * diffusion_N).reshape(num, num).sum(1)
  return totals + (recon + prior) * length


def dgemma(schedule, t_min=0.0, **kw):
  return DGemmaDiffusion(schedule, V, C, t_min=t_min, **kw)


@pytest.mark.parametrize('length', [2, 4])
def test_oracle_bound_is_the_nll_with_the_tight_schedule(length):
  p_S, seqs = source(length), sequences(length)
  process = dgemma(TIGHT)
  denoiser = lambda a: oracle_logits(p_S, seqs, a)
  bound_S = enumerated_bound(process, p_S, denoiser)
  np.testing.assert_allclose(bound_S, -np.log(p_S), rtol=2e-3, atol=2e-3)


def test_other_denoisers_and_schedules_stay_above_the_entropy():
  length = 4
  p_S, seqs = source(length, seed=1), sequences(length)
  entropy = -np.sum(p_S * np.log(p_S))
  rng = np.random.default_rng(3)
  table_ZxLxV = rng.normal(size=(len(seqs), length, V))
  random = np.broadcast_to(table_ZxLxV, (len(seqs),) + table_ZxLxV.shape)
  cases = {
    'oracle, log-linear, t_min 1e-3': (
      dgemma(LogLinearSchedule(), t_min=1e-3),
      lambda a: oracle_logits(p_S, seqs, a),
    ),
    'unconditional blocks': (
      dgemma(TIGHT),
      lambda a: oracle_logits(p_S, seqs, a, conditional=False),
    ),
    'random logits': (dgemma(TIGHT), lambda a: random),
  }
  means = {}
  for name, (process, denoiser) in cases.items():
    means[name] = float(p_S @ enumerated_bound(process, p_S, denoiser))
    assert means[name] > entropy + 1e-3, (name, means[name], entropy)
  # Dropping the clean prefix loses the dependence between the blocks.
  assert means['unconditional blocks'] > entropy + 0.01


# ------------------------------------------------------ the network pass --


def tiny_model(vocab=11, block=4, seed=0, **model):
  process = DGemmaDiffusion(LogLinearSchedule(), vocab, block)
  keys = dict(width=32, depth=2, num_heads=2, sliding_window=6, **model)
  cfg = run_model_config(keys, process)
  return process, DGemmaBackbone(cfg, rngs=nnx.Rngs(seed))


def test_each_block_reads_its_clean_prefix_only():
  """The vectorised pass equals the sampler's order (encode the clean
  blocks one by one, decode block b), and block b's logits ignore the
  noisy tokens of other blocks and the clean tokens from b on."""
  process, model = tiny_model()
  key_x, key_z = jax.random.split(jax.random.key(0))
  x = jax.random.randint(key_x, (2, 12), 0, 11)
  z = jax.random.randint(key_z, (2, 12), 0, 11)
  vectorised = jax.jit(lambda z, x: block_logits(model, z, x, 4))
  decode = jax.jit(lambda z, cache: model.decode(z, cache))
  encode = jax.jit(lambda x, cache: model.encode(x, cache)[1])
  logits = vectorised(z, x)
  cache = model.init_cache(2, 12)
  for b in range(3):
    want = decode(z[:, 4 * b : 4 * b + 4], cache)
    np.testing.assert_allclose(logits[:, 4 * b : 4 * b + 4], want, atol=2e-5)
    cache = encode(x[:, 4 * b : 4 * b + 4], cache)
  z2 = z.at[:, 4:8].set((z[:, 4:8] + 1) % 11)
  x2 = x.at[:, 4:].set((x[:, 4:] + 1) % 11)
  other = vectorised(z2, x2)
  np.testing.assert_allclose(other[:, :4], logits[:, :4], atol=1e-6)
  assert not np.allclose(other[:, 4:8], logits[:, 4:8], atol=1e-3)


def _loss(process, model, x, key=7):
  graphdef, params = nnx.split(model, nnx.Param)
  return np.asarray(_jit_loss(graphdef, process, params, x, key))


@functools.partial(jax.jit, static_argnames=('graphdef', 'process'))
def _jit_loss(graphdef, process, params, x, key):
  return process.loss(nnx.merge(graphdef, params), jax.random.key(key), x)[0]


def _scale_self_conditioning(model, factor):
  state = nnx.state(model.net.self_conditioning.mlp, nnx.Param)
  state = jax.tree.map(lambda a: a * factor, state)
  nnx.update(model.net.self_conditioning.mlp, state)


def test_self_conditioning_off_is_the_model_without_the_module_path():
  """p = 0 runs one pass with a zero signal: the module's weights do not
  matter. p = 1 with the module's output zeroed is the same loss; with the
  module live it is not."""
  process, model = tiny_model()
  x = jax.random.randint(jax.random.key(1), (4, 12), 0, 11)
  off = dataclasses.replace(process, self_conditioning=0.0)
  on = dataclasses.replace(process, self_conditioning=1.0)
  base_off, base_on = _loss(off, model, x), _loss(on, model, x)
  assert not np.allclose(base_on, base_off, rtol=1e-4)
  _scale_self_conditioning(model, 3.0)
  np.testing.assert_allclose(_loss(off, model, x), base_off, rtol=1e-6)
  assert not np.allclose(_loss(on, model, x), base_on, rtol=1e-4)
  _scale_self_conditioning(model, 0.0)
  np.testing.assert_allclose(_loss(on, model, x), base_off, rtol=1e-5)
  # The no-signal pass is exactly the plain decoder call per block.
  t, w, z = off.draw(jax.random.split(jax.random.key(7))[0], x)
  plain = jax.jit(lambda z, x: block_logits(model, z, x, 4))(z, x)
  np.testing.assert_allclose(
    np.asarray(off.bound(plain, x, z, t, w)[0]), base_off, rtol=1e-5
  )


def test_self_conditioning_trains_the_module_only_when_on():
  process, model = tiny_model()
  x = jax.random.randint(jax.random.key(2), (4, 12), 0, 11)
  graphdef, params = nnx.split(model, nnx.Param)

  def grad_norm(p):
    proc = dataclasses.replace(process, self_conditioning=p)
    loss = lambda ps: proc.loss(nnx.merge(graphdef, ps), jax.random.key(3), x)[
      0
    ].sum()
    g = jax.jit(jax.grad(loss))(params)
    sc = g['net']['self_conditioning']['mlp']
    return sum(float(jnp.abs(a).sum()) for a in jax.tree.leaves(sc))

  assert grad_norm(0.0) == 0.0
  assert grad_norm(1.0) > 0.0


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match='self_conditioning=1.5'):
    DGemmaDiffusion(LogLinearSchedule(), 11, 4, self_conditioning=1.5)
  with pytest.raises(ValueError, match='does not divide'):
    DGemmaDiffusion(LogLinearSchedule(), 11, 5).check_length(12)
  process = DGemmaDiffusion(LogLinearSchedule(), 11, 4)
  with pytest.raises(ValueError, match="model.backbone='diffusion_gemma'"):
    from ddlm_jax.models.backbones import get_backbone

    get_backbone('diffusion_gemma').config(
      {'width': 32}, dataclasses.replace(process).masked_process
    )
  with pytest.raises(ValueError, match='does not take'):
    run_model_config({'width': 32, 'mlp_kind': 'swiglu'}, process)
  with pytest.raises(ValueError, match='layer_pattern'):
    run_model_config({'depth': 2, 'layer_pattern': 'SX'}, process)


# ------------------------------------------------------------ the sampler --


def test_sampler_is_registered_for_the_family():
  assert samplers_for('dgemma') == ['entropy_bound_canvas']
  sampler = get_sampler('entropy_bound_canvas', num_steps=5)
  assert sampler.canvas_config.max_denoising_steps == 5
  with pytest.raises(ValueError, match='anneals its own temperature'):
    get_sampler('entropy_bound_canvas', temperature=0.5)
  with pytest.raises(ValueError, match='entropy_bound'):
    get_sampler('entropy_bound_canvas', entropy_bound=0.0)


@pytest.mark.parametrize('batch', [1, 3])
def test_jitted_sampler_matches_the_host_sampler(batch):
  """Same noise, prompt = the first canvas: the registry sampler gives the
  host loop's tokens, and with one row its number of decoder calls."""
  process, model = tiny_model(vocab=7, block=4, seed=1, logit_softcap=3.0)
  cfg = ebc.EntropyBoundCanvasConfig(
    max_new_tokens=8, max_denoising_steps=6, entropy_bound=0.5,
    confidence_threshold=0.8,
  )  # fmt: skip
  prompt = jax.random.randint(jax.random.key(4), (batch, 4), 0, 7)
  noise = ebc.draw_noise(jax.random.key(5), 3, 6, batch, 4, 7)
  tail = ebc.CanvasNoise(*(a[1:] for a in noise))
  want = ebc.generate(model.net, prompt, cfg, noise=tail)
  z = jnp.concatenate([prompt, jnp.full((batch, 8), 7)], axis=1)
  given = z != 7
  run = jax.jit(lambda z, g, n: fill_canvases(model, z, g, n, cfg))
  tokens, nfe = run(z, given, noise)
  np.testing.assert_array_equal(np.asarray(tokens), want.tokens)
  if batch == 1:
    assert int(nfe) == int(want.decoder_calls[0])
  assert 2 <= int(nfe) <= 12


def test_sampler_through_the_registry_keeps_the_prompt():
  process, model = tiny_model(vocab=7, block=4)
  sampler = get_sampler('entropy_bound_canvas', num_steps=4)
  assert isinstance(sampler, EntropyBoundCanvasSampler)
  keep = jnp.zeros((2, 12), bool).at[:, :6].set(True)
  prompt = jnp.full((2, 12), 3).at[:, 1].set(5)
  fn = jax.jit(
    lambda key: sampler(
      model, key, process, batch=2, length=12, prompt_BxL=(prompt, keep)
    )
  )
  tokens, nfe = fn(jax.random.key(0))
  tokens = np.asarray(tokens)
  np.testing.assert_array_equal(tokens[:, :6], np.asarray(prompt)[:, :6])
  assert tokens.min() >= 0 and tokens.max() < 7
  assert 2 <= int(nfe) <= 3 * 4  # Canvases 2 and 3 each take 1..4 calls.
