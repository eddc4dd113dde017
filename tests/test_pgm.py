"""PGM: the partition network's masks, the bound, the sampler, the run.

- Masks by group: a position's encoder output does not change when a
  token of the other group changes; a position's logits do not change
  when any token of its own group (itself included) changes, so the
  decoder's queries carry no token information; a query's logits do not
  depend on which other queries are asked.
- The bound: on V = 3, L = 3, for every sequence and a fixed arbitrary
  denoiser (a random table of logits per position and visible context),
  PGM's expected bound equals MDLM's full bound on the same range of
  times, both computed exactly: Gauss-Legendre quadrature over t (the
  integrands are polynomials in t for the log-linear schedule) and
  enumeration of the 2^L partitions / masks. A Monte-Carlo mean of
  `loss` lands on the same value.
- The sampler: with an oracle network (exact conditionals of a tiny
  source) and one position per step its samples follow the source; NFE
  = T; prompt positions stay.
- `pgm.py:smoke` trains, evaluates and samples through `experiments.run`.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.diffusion import base
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.pgm import PGMDiffusion, symmetric_range
from ddlm_jax.diffusion.schedules import LogLinearSchedule, get_schedule
from ddlm_jax.evaluation.cost import transformer_flops
from ddlm_jax.models.backbones import get_backbone
from ddlm_jax.models.pgm import PGM, PGMConfig
from ddlm_jax.models.transformer import TransformerConfig
from ddlm_jax.sampling.pgm import PGMCost, encoder_buckets, estimate_flops
from ddlm_jax.sampling.registry import get_sampler, samplers_for
from ddlm_jax.training import builders
from ddlm_jax.training.builders import check_process
from ddlm_jax.training.config import ConfigError
from experiments import claims as registry
from experiments.configs import mdlm_quickstart
from experiments.configs import pgm as pgm_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB, LENGTH = 3, 3
SEQS_NxL = np.array(list(itertools.product(range(VOCAB), repeat=LENGTH)))


def tiny_net(seed=0, vocab=7):
  cfg = PGMConfig(vocab_size=vocab, width=32, depth=3, decoder_depth=2,
                  num_heads=2)  # fmt: skip
  net = PGM(cfg, rngs=nnx.Rngs(seed))
  # The head starts at zero (every logit 0): give it weights, so a leak
  # would show in the logits.
  net.head.kernel[...] = jax.random.normal(jax.random.key(seed + 1),
                                           net.head.kernel.shape)  # fmt: skip
  return net


# ------------------------------------------------------- masks by group --


def test_encoder_output_ignores_the_other_group():
  net = tiny_net()
  x_BxL = jax.random.randint(jax.random.key(0), (2, 10), 0, 7)
  groups_BxL = jnp.array([[0, 1] * 5, [1, 1, 0, 0, 1, 0, 1, 0, 0, 1]])
  base_BxLxD = net.encode(x_BxL, None, groups_BxL)
  for j in range(10):
    x2 = x_BxL.at[:, j].set((x_BxL[:, j] + 1) % 7)
    out = net.encode(x2, None, groups_BxL)
    for b in range(2):
      same_L = groups_BxL[b] != groups_BxL[b, j]
      np.testing.assert_allclose(out[b][same_L], base_BxLxD[b][same_L],
                                 atol=1e-6)  # fmt: skip
      # The test can fail: the changed token's own group does see it.
      assert np.abs(out[b][~same_L] - base_BxLxD[b][~same_L]).max() > 1e-4


def test_logits_read_only_the_other_group():
  """A token's logits ignore its own group, itself included: the queries
  are built from positions, never from the token they predict."""
  net = tiny_net()
  x_BxL = jax.random.randint(jax.random.key(1), (2, 10), 0, 7)
  groups_BxL = jnp.array([[0, 1] * 5, [0, 0, 0, 1, 1, 0, 1, 1, 1, 0]])
  base_BxLxV = net.partition_logits(x_BxL, groups_BxL)
  for j in range(10):
    x2 = x_BxL.at[:, j].set((x_BxL[:, j] + 3) % 7)
    out = net.partition_logits(x2, groups_BxL)
    for b in range(2):
      own_L = groups_BxL[b] == groups_BxL[b, j]
      np.testing.assert_allclose(out[b][own_L], base_BxLxV[b][own_L],
                                 atol=1e-5)  # fmt: skip
      assert np.abs(out[b][~own_L] - base_BxLxV[b][~own_L]).max() > 1e-4


def test_a_query_does_not_depend_on_the_other_queries():
  net = tiny_net()
  x_BxL = jax.random.randint(jax.random.key(2), (1, 12), 0, 7)
  groups_BxL = jnp.array([[0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1]])
  full_BxLxV = net.partition_logits(x_BxL, groups_BxL)
  positions_BxL = jnp.arange(12)[None]
  memory = net.encode(x_BxL, None, groups_BxL)
  asked = jnp.array([[2, 9]])  # two group-1 positions alone
  part = net.decode(memory, positions_BxL, groups_BxL, asked,
                    jnp.ones_like(asked))  # fmt: skip
  np.testing.assert_allclose(part[0], full_BxLxV[0, asked[0]], atol=1e-5)


def test_an_empty_group_reads_the_sink():
  """All of a row in one group: its queries see only the sink, finite."""
  net = tiny_net()
  x_BxL = jax.random.randint(jax.random.key(3), (1, 8), 0, 7)
  logits = net.partition_logits(x_BxL, jnp.ones((1, 8), jnp.int32))
  assert np.all(np.isfinite(logits))
  # Every query reads the same (sink-only) context: logits differ only by
  # position.
  other = net.partition_logits((x_BxL + 1) % 7, jnp.ones((1, 8), jnp.int32))
  np.testing.assert_allclose(logits, other, atol=1e-6)


# ------------------------------------------------------------ the bound --


def denoiser_table(seed=0):
  """Logits per (position, visible set, visible tokens): any function of
  what the position may see is a denoiser both processes can use."""
  rng = np.random.default_rng(seed)
  table = {}
  for i in range(LENGTH):
    others = [j for j in range(LENGTH) if j != i]
    for r in range(len(others) + 1):
      for vis in itertools.combinations(others, r):
        for vals in itertools.product(range(VOCAB), repeat=len(vis)):
          table[i, vis, vals] = rng.normal(size=VOCAB) * 2.0
  return table


def logits_for(table, x_L, visible_L):
  """[L, V]: position i's logits given the visible positions (not i)."""
  out = []
  for i in range(LENGTH):
    vis = tuple(j for j in range(LENGTH) if visible_L[j] and j != i)
    out.append(table[i, vis, tuple(int(x_L[j]) for j in vis)])
  return np.stack(out)


def expected_bounds(schedule, t_min, x_L, table, nodes=24, cls=PGMDiffusion):
  """(PGM, MDLM) expected NELBO of x, exactly (module docstring)."""
  pgm = cls(schedule=schedule, vocab_size=VOCAB, t_min=t_min)
  t_lo, t_hi = pgm.time_range
  assert t_hi == 1.0  # MDLM draws t up to 1.
  mdlm = MaskedDiffusion(schedule=schedule, vocab_size=VOCAB, t_min=t_lo)
  u_N, w_N = np.polynomial.legendre.leggauss(nodes)
  t_N = t_lo + (t_hi - t_lo) * (u_N + 1) / 2
  w_N = w_N / 2  # mean over U[t_lo, t_hi]
  patterns_PxL = np.array(list(itertools.product((0, 1), repeat=LENGTH)))
  pgm_total = mdlm_total = 0.0
  x_1xL = jnp.asarray(x_L)[None]
  for t, w in zip(t_N, w_N):
    r = 1.0 - float(schedule.alpha(t))
    for g_L in patterns_PxL:
      prob = np.prod(np.where(g_L == 1, r, 1.0 - r))
      t_1 = jnp.array([t], jnp.float32)
      # PGM: group g read from the other group.
      logits = np.where(
        (g_L == 1)[:, None],
        logits_for(table, x_L, g_L == 0),
        logits_for(table, x_L, g_L == 1),
      )
      _, nelbo, _ = pgm.bound(jnp.asarray(logits)[None], x_1xL,
                              jnp.asarray(g_L)[None], t_1,
                              pgm.group_weights(t_1), None)  # fmt: skip
      pgm_total += w * prob * float(nelbo[0])
      # MDLM: g = 1 is masked, read from the kept tokens.
      z_1xL = jnp.where(jnp.asarray(g_L)[None] == 1, VOCAB, x_1xL)
      logits = logits_for(table, x_L, g_L == 0)
      _, nelbo, _ = mdlm.bound(jnp.asarray(logits)[None], x_1xL, z_1xL, t_1,
                               mdlm.time_weight(t_1), None)  # fmt: skip
      mdlm_total += w * prob * float(nelbo[0])
  return pgm_total, mdlm_total


@pytest.mark.parametrize('eps', [1e-3, 0.05])
def test_expected_loss_equals_mdlm_bound(eps):
  schedule = LogLinearSchedule(eps=eps)
  table = denoiser_table()
  for x_L in SEQS_NxL[::4]:
    pgm, mdlm = expected_bounds(schedule, 1e-3, x_L, table)
    np.testing.assert_allclose(pgm, mdlm, rtol=2e-5)


def test_the_complement_weight_is_needed():
  """The test can fail: weighting group 0 with MDLM's w(t), as if it were
  the masked set at t, gives another expectation."""
  schedule = LogLinearSchedule(eps=0.05)
  table = denoiser_table(1)

  class Wrong(PGMDiffusion):
    def group_weights(self, t_B):
      w_Bx2 = super().group_weights(t_B)
      return jnp.stack([w_Bx2[:, 1], w_Bx2[:, 1]], -1)

  x_L = SEQS_NxL[5]
  wrong, mdlm = expected_bounds(schedule, 1e-3, x_L, table, cls=Wrong)
  assert abs(wrong - mdlm) > 1e-2 * mdlm


def test_symmetric_range_pairs_rates():
  for name, kwargs in [('loglinear', {}), ('linear', {}), ('cosine', {})]:
    schedule = get_schedule(name, **kwargs)
    t_lo, t_hi = symmetric_range(schedule, 1e-3)
    r_lo = 1.0 - float(schedule.alpha(t_lo))
    r_hi = 1.0 - float(schedule.alpha(t_hi))
    assert r_lo + r_hi == pytest.approx(1.0, abs=1e-6)  # float32 alpha
    assert 1e-3 <= t_lo < t_hi <= 1.0
  with pytest.raises(ValueError, match='contain'):
    symmetric_range(LogLinearSchedule(eps=0.6), 1e-3)


def test_monte_carlo_loss_matches_the_exact_expectation():
  """`loss` (draw, one network pass, bound) is unbiased for the exact
  expectation, with a network that reads the partition as the table
  denoiser does."""
  schedule = LogLinearSchedule(eps=0.05)
  table = denoiser_table(2)
  x_L = SEQS_NxL[7]
  exact, _ = expected_bounds(schedule, 1e-3, x_L, table)
  pgm = PGMDiffusion(schedule=schedule, vocab_size=VOCAB, t_min=1e-3)

  class TableNet:
    def partition_logits(self, x_BxL, groups_BxL):
      def one(g_L):
        g_L = np.asarray(g_L)
        return np.where((g_L == 1)[:, None],
                        logits_for(table, x_L, g_L == 0),
                        logits_for(table, x_L, g_L == 1))  # fmt: skip

      out = jax.pure_callback(
        lambda g: np.stack([one(r) for r in g]).astype(np.float32),
        jax.ShapeDtypeStruct(x_BxL.shape + (VOCAB,), jnp.float32),
        groups_BxL,
      )
      return out

  batch = 4000
  x_BxL = jnp.broadcast_to(jnp.asarray(x_L), (batch, LENGTH))
  _, nelbo_B, _ = pgm.loss(TableNet(), jax.random.key(0), x_BxL)
  nelbo_B = np.asarray(nelbo_B)
  stderr = nelbo_B.std() / np.sqrt(batch)
  assert abs(nelbo_B.mean() - exact) < 4 * stderr


# ----------------------------------------------------------- the sampler --


def source_probs(seed=0):
  rng = np.random.default_rng(seed)
  p = np.exp(rng.normal(size=len(SEQS_NxL)) * 1.5)
  return p / p.sum()


class OracleNet:
  """encode / decode with the exact conditionals of a tiny source: the
  memory holds each clean token and its position; a query's logits are
  log p(x_q | the keys of the other group)."""

  def __init__(self, probs_N):
    self.seqs = jnp.asarray(SEQS_NxL)
    self.logp = jnp.log(jnp.asarray(probs_N, jnp.float32))

  def encode(self, tokens_BxN, positions_BxN, segment_BxN):
    del positions_BxN, segment_BxN
    return tokens_BxN

  def decode(self, memory_BxS, key_pos_BxS, key_groups_BxS, q_pos_BxK,
             q_groups_BxK):  # fmt: skip
    del q_groups_BxK  # The sampler's queries are group 0.
    seq_at_keys = self.seqs[:, key_pos_BxS]  # [N, B, S]
    match = (seq_at_keys == memory_BxS[None]) | (key_groups_BxS[None] != 1)
    ok_NxB = jnp.all(match, -1)
    w_NxB = jnp.where(ok_NxB, self.logp[:, None], -jnp.inf)
    onehot = jax.nn.one_hot(self.seqs[:, q_pos_BxK], VOCAB)  # [N,B,K,V]
    joint = w_NxB[:, :, None, None] + jnp.log(onehot)
    return jax.nn.logsumexp(joint, axis=0)


def test_sampler_with_exact_conditionals_follows_the_source():
  probs = source_probs()
  process = PGMDiffusion(LogLinearSchedule(), VOCAB)
  sampler = get_sampler('pgm', num_steps=LENGTH, buckets=2)
  batch = 6000
  tokens, nfe = jax.jit(
    lambda k: sampler(
      OracleNet(probs), k, process, batch=batch, length=LENGTH
    )  # fmt: skip
  )(jax.random.key(0))
  assert int(nfe) == LENGTH
  ids = np.asarray(tokens) @ (VOCAB ** np.arange(LENGTH - 1, -1, -1))
  freq = np.bincount(ids, minlength=len(SEQS_NxL)) / batch
  assert 0.5 * np.abs(freq - probs).sum() < 0.04
  # The test can fail: all positions in one step draw from the marginals
  # independently, which is another distribution.
  one_step = get_sampler('pgm', num_steps=1)
  tokens, _ = one_step(OracleNet(probs), jax.random.key(1), process,
                       batch=batch, length=LENGTH)  # fmt: skip
  ids = np.asarray(tokens) @ (VOCAB ** np.arange(LENGTH - 1, -1, -1))
  freq = np.bincount(ids, minlength=len(SEQS_NxL)) / batch
  assert 0.5 * np.abs(freq - probs).sum() > 0.1


@pytest.mark.parametrize('steps,length', [(16, 16), (5, 16), (4, 18)])
def test_nfe_is_t_and_every_position_is_filled(steps, length):
  net = tiny_net(vocab=7)
  process = PGMDiffusion(LogLinearSchedule(), 7)
  sampler = get_sampler('pgm', num_steps=steps, buckets=3)
  out = sampler.generate(net, jax.random.key(0), process, batch=2,
                         length=length)  # fmt: skip
  assert int(out.nfe) == steps
  tokens = np.asarray(out.tokens_BxL)
  assert tokens.shape == (2, length) and tokens.max() < 7
  assert float(out.cost.decoder_queries) == steps * -(-length // steps)


def test_prompt_positions_stay():
  net = tiny_net(vocab=7)
  process = PGMDiffusion(LogLinearSchedule(), 7)
  prompt = np.full((2, 12), process.generate_id)
  prompt[:, :4] = [[1, 2, 3, 4], [4, 3, 2, 1]]
  tokens, nfe = get_sampler('pgm', num_steps=4)(
    net, jax.random.key(0), process, batch=2, length=12,
    prompt_BxL=jnp.asarray(prompt),
  )  # fmt: skip
  np.testing.assert_array_equal(np.asarray(tokens)[:, :4], prompt[:, :4])
  assert int(nfe) == 4 and np.asarray(tokens).max() < 7


def test_encoder_buckets_cover_the_clean_tokens():
  for length, steps, buckets in [(256, 256, 8), (32, 5, 3), (10, 20, 4)]:
    spans = encoder_buckets(length, steps, buckets, known=0)
    assert spans[0][1] == 0 and spans[-1][2] == steps
    assert len(spans) <= buckets
    for cap, first, end in spans:
      for j in range(first, end):  # the clean tokens of step j fit
        assert j * length // steps <= cap <= length


def test_sampler_family_and_refusals():
  assert samplers_for('pgm') == ['pgm']
  with pytest.raises(ValueError, match='pgm'):
    get_sampler('ancestral')(None, jax.random.key(0),
                             PGMDiffusion(LogLinearSchedule(), 7), batch=1,
                             length=4)  # fmt: skip
  with pytest.raises(ValueError, match='num_steps'):
    get_sampler('pgm', num_steps=0)


def test_sampling_flops_are_below_a_full_pass_per_step():
  """At T = L the work is about half the encoder passes of a network run
  on all L positions every step, and the decoder is cheap."""
  cfg = PGMConfig(vocab_size=65, width=128, depth=4, decoder_depth=2)
  length = 256
  spans = encoder_buckets(length, length, 8, known=0)
  enc = sum((e - f) * c for c, f, e in spans)
  cost = PGMCost(
    jnp.float32(enc),
    jnp.float32(sum((e - f) * c * c for c, f, e in spans)),
    jnp.float32(length),
    jnp.float32(enc + length),
    jnp.float32(enc + length),
  )
  pgm = estimate_flops(cfg, cost, 1)
  mdlm = length * transformer_flops(
    TransformerConfig(
      vocab_size=65, input_vocab_size=66, width=128, depth=4
    ),  # fmt: skip
    1,
    length,
  )
  assert 2.0 * pgm < mdlm


# ---------------------------------------------------- config and the run --


def _params(model_cfg, process):
  build = builders.model_builder(model_cfg, process)
  state = nnx.state(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param)
  return sum(x.size for x in jax.tree.leaves(state))


def test_config_matches_the_mdlm_quickstart_parameter_count():
  c = pgm_config.get_config()
  settings = base.process_config(c.process.to_dict())
  process = settings.build(65)
  assert isinstance(process, PGMDiffusion)
  check_process(settings, c.model, c.data.seq_len)
  ref = mdlm_quickstart.get_config()
  mdlm = base.process_config(ref.process.to_dict()).build(65)
  ours, theirs = _params(c.model, process), _params(ref.model, mdlm)
  assert abs(ours / theirs - 1.0) < 0.03
  mcfg = get_backbone('pgm').config(c.model.to_dict(), process)
  assert (mcfg.encoder_depth, mcfg.decoder_depth) == (2, 2)
  assert c.sample.sampler == 'pgm'


def test_bad_settings_are_refused_before_running():
  c = pgm_config.get_config('smoke')
  settings = base.process_config(c.process.to_dict())
  model = dict(c.model.to_dict(), backbone='transformer')
  with pytest.raises(ConfigError, match="backbone='pgm'"):
    check_process(settings, model, c.data.seq_len)
  model = dict(c.model.to_dict(), time_conditioning=True)
  with pytest.raises(ConfigError, match='time-free'):
    check_process(settings, model, c.data.seq_len)
  model = dict(c.model.to_dict(), attention_impl='cudnn')
  with pytest.raises(ConfigError, match='cudnn'):
    check_process(settings, model, c.data.seq_len)
  process = settings.build(65)
  with pytest.raises(ConfigError, match='decoder_depth'):
    get_backbone('pgm').config(dict(c.model.to_dict(), decoder_depth=2),
                               process)  # fmt: skip
  with pytest.raises(ConfigError, match='does not take'):
    get_backbone('pgm').config(dict(c.model.to_dict(), pattern='AA'),
                               process)  # fmt: skip


def _run(workdir, *args):
  cmd = [sys.executable, '-m', 'experiments.run', f'--workdir={workdir}']
  out = subprocess.run(
    cmd + list(args), cwd=ROOT, capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.slow
def test_smoke_trains_evaluates_and_samples(tmp_path, smoke_mdlm_run):
  config = '--config=experiments/configs/pgm.py:smoke'
  out = _run(tmp_path, config)
  assert 'bits/token' in out.stdout
  saved = json.loads((tmp_path / 'config.json').read_text())
  assert saved['process']['kind'] == 'pgm'
  assert saved['model']['backbone'] == 'pgm'
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['status'] == 'ok'
  _run(tmp_path, '--mode=eval')
  _run(tmp_path, '--mode=sample', config, '--config.sample.steps=8')
  stats = json.loads((tmp_path / 'sample_stats_2.json').read_text())
  assert stats['sampler'] == 'pgm' and stats['steps'] == 8
  assert stats['nfe'] == 8
  # FLOPs from the work done: below eight full passes of the network.
  assert 0 < stats['flops_per_sample'] < 8 * stats['flops_per_call'][0] / 2
  # The sampling benchmark against a masked run of the same length.
  from experiments.benchmarks import pgm_sampling

  mdlm, _ = smoke_mdlm_run
  argv = [f'--mdlm={mdlm}', f'--pgm={tmp_path}', '--seeds=0', '--repeats=2']
  rows_json = tmp_path / 'rows.json'
  (row,) = pgm_sampling.main(argv + ['--num_samples=2', f'--json={rows_json}'])
  # The claims read their ratios from the JSON a reproduce process writes.
  for claim, key in (
    ('pgm-sampling-flops', 'flops_ratio'),
    ('pgm-sampling-speed', 'speed_ratio'),
  ):
    rows = json.loads(rows_json.read_text())
    value = registry.get(claim).measurement.value(rows)
    assert value == pytest.approx(row[key])
  notes = registry.get('pgm-sampling-speed').measurement.describe([rows])
  assert notes.startswith('MDLM / PGM at T = L = 32,') and 'seed 0:' in notes
  assert row['pgm']['nfe'] == row['pgm']['steps'] == 32  # T = L
  assert row['flops_ratio'] > 1  # one position per decoder call
  for name in ('mdlm', 'pgm'):
    assert row[name]['seconds_best'] <= row[name]['seconds_median']
  assert row['speed_ratio'] == pytest.approx(
    row['mdlm']['seconds_best'] / row['pgm']['seconds_best']
  )
  with pytest.raises(SystemExit):
    pgm_sampling.main(argv + ['--num_samples=0'])


def test_remat_keeps_the_loss_and_its_gradient():
  process = PGMDiffusion(LogLinearSchedule(), 7)
  x_BxL = jax.random.randint(jax.random.key(4), (2, 8), 0, 7)
  out = []
  for remat in (False, True):
    cfg = PGMConfig(vocab_size=7, width=32, depth=2, decoder_depth=1,
                    num_heads=2, remat=remat)  # fmt: skip
    graphdef, params = nnx.split(PGM(cfg, rngs=nnx.Rngs(0)))

    def loss(params, graphdef=graphdef):
      net = nnx.merge(graphdef, params)
      return process.loss(net, jax.random.key(5), x_BxL)[0].mean()

    out.append(jax.jit(jax.value_and_grad(loss))(params))
  np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(out[0][1]), jax.tree.leaves(out[1][1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_sampling_claims_time_the_bound_claims_runs():
  """The timing claims read the runs the bound claim trains (same arm
  keys, so `experiments.reproduce` trains them once), seed by seed."""
  from experiments import claims, reproduce

  bound = claims.get('pgm-bound-near-mdlm')
  keys = {a.name: reproduce.arm_key(a, 'cpu', bound) for a in bound.arms}
  for name in ('pgm-sampling-flops', 'pgm-sampling-speed'):
    claim = claims.get(name)
    assert claim.command == f'python -m experiments.reproduce {name}'
    assert claim.measurement.runs == set(keys)
    assert {a.name: reproduce.arm_key(a, 'cpu', claim) for a in claim.arms} == (
      keys
    )
    args = claim.measurement.args_for('cpu', 2, {'mdlm': 'M', 'pgm': 'P'})
    assert {'--mdlm=M', '--pgm=P', '--seeds=2'} <= set(args)
