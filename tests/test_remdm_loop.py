"""ReMDM's loop strategy on the paper's rescaled schedule.

The sampler's alpha rises linearly from 0 to alpha_on over [1, t_on], stays
at alpha_on during the loop (remasking with sigma = min(eta, (1 - alpha_on)
/ alpha_on)) and rises to 1 over [t_off, 0] (ReMDM, arXiv 2503.00307). Checked
exactly from the grid's constants and by Monte Carlo on a tiny fake model.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.sampling import grid as grid_lib
from ddlm_jax.sampling.registry import get_sampler, parse_spec
from ddlm_jax.sampling.remdm import ReMDMSampler, loop_alphas, loop_phase_steps

V = 5
PROCESS = MaskedDiffusion(get_schedule('loglinear'), vocab_size=V)
FILTERS = dict(temperature=1.0, top_k=0, top_p=1.0)


def _expected_masked(grid):
  """E[masked fraction] of free positions before each step and at the end.

  m' = m (1 - p) + (1 - m) sigma: masked ones are revealed w.p. p, revealed
  ones remasked w.p. sigma (the grid's constants, exactly).
  """
  m = [1.0]
  for p, s in zip(grid.p_unmask, grid.sigma):
    m.append(m[-1] * (1 - float(p)) + (1 - m[-1]) * float(s))
  return np.array(m)


@pytest.mark.parametrize('schedule', ['loglinear', 'cosine'])
@pytest.mark.parametrize(
  'steps,alpha_on,eta', [(128, 0.9, 0.02), (40, 0.7, 0.3), (24, 0.9, 0.5)]
)
def test_loop_holds_the_masked_fraction_at_one_minus_alpha_on(
  schedule, steps, alpha_on, eta
):
  process = MaskedDiffusion(get_schedule(schedule), vocab_size=V)
  sampler = ReMDMSampler(
    num_steps=steps, eta=eta, strategy='loop', alpha_on=alpha_on
  )
  grid = sampler.grid(process)
  n_on, n_loop, n_off = loop_phase_steps(steps, 0.55, 0.05)
  assert n_on + n_loop + n_off == steps and n_loop > 0 and n_off > 0
  m = _expected_masked(grid)
  # After the ramp and before/after every loop step: exactly 1 - alpha_on
  # (float32 constants: ~1e-6).
  np.testing.assert_allclose(
    m[n_on : n_on + n_loop + 1], 1 - alpha_on, atol=2e-6
  )
  # The ramps are ancestral, the loop remasks at the capped sigma.
  sigma = min(eta, (1 - alpha_on) / alpha_on)
  np.testing.assert_allclose(grid.sigma[n_on : n_on + n_loop], sigma)
  assert not grid.sigma[:n_on].any() and not grid.sigma[n_on + n_loop :].any()
  # Final stretch: each step reveals L * delta alpha of L tokens in
  # expectation, delta alpha = (1 - alpha_on) / n_off, and nothing is left.
  reveal = -np.diff(m[n_on + n_loop :])
  np.testing.assert_allclose(reveal, (1 - alpha_on) / n_off, atol=2e-6)
  assert m[-1] == 0.0
  # The network is called where the model's alpha equals the sampler's.
  alpha_T1 = loop_alphas(steps, 0.55, 0.05, alpha_on)
  a_net = grid_lib.alphas(process, grid.t)
  inside = alpha_T1[:-1] >= float(grid_lib.alphas(process, np.ones(1))[0])
  np.testing.assert_allclose(a_net[inside], alpha_T1[:-1][inside], atol=2e-5)
  assert grid.t[0] == pytest.approx(1.0, abs=1e-6)  # all masked: t = 1.


def test_paper_setting_loop_and_final_stretch_differ_from_the_old_bug():
  """T = 128, L = 128: ~12.8 masked tokens in the loop (old: ~70), and the
  final 6 steps reveal ~2.1 each (old: ~12)."""
  steps, length = 128, 128
  grid = ReMDMSampler(num_steps=steps, eta=0.02, strategy='loop').grid(PROCESS)
  n_on, n_loop, n_off = loop_phase_steps(steps, 0.55, 0.05)
  assert (n_on, n_loop, n_off) == (58, 64, 6)
  m = _expected_masked(grid)
  assert length * m[n_on] == pytest.approx(12.8, abs=1e-3)
  per_step = -length * np.diff(m[n_on + n_loop :])
  np.testing.assert_allclose(per_step, 12.8 / 6, atol=1e-3)
  # Loop steps see the model's alpha = 0.9: t = 0.1 / (1 - eps).
  np.testing.assert_allclose(grid.t[n_on : n_on + n_loop], 0.1 / 0.999, 1e-4)


def test_eta_zero_is_ancestral_sampling_on_the_rescaled_path():
  steps = 24
  grid = ReMDMSampler(num_steps=steps, eta=0.0, strategy='loop').grid(PROCESS)
  assert not grid.remasks
  a = loop_alphas(steps, 0.55, 0.05, 0.9)
  p = (a[1:] - a[:-1]) / (1 - a[:-1])
  p[-1] = 1.0
  np.testing.assert_allclose(grid.p_unmask, p, rtol=1e-6, atol=1e-7)
  # The same tokens as the plain ancestral walk on that alpha grid.
  plain = grid_lib.make_alpha_grid(PROCESS, a)
  apply = _fake_model()
  z0 = jnp.full((4, 12), V, jnp.int32)
  window = jnp.ones_like(z0, bool)
  key = jax.random.key(3)
  sampler = get_sampler('remdm', num_steps=steps, eta=0.0, strategy='loop')
  got, _ = sampler(apply, key, PROCESS, batch=4, length=12)
  # The sampler's own key handling: compare fills on one key.
  want, _ = grid_lib.stepwise_fill(
    (apply,), key, PROCESS, z0, window, plain, use_cache=False, filters=FILTERS
  )
  mine, _ = grid_lib.stepwise_fill(
    (apply,), key, PROCESS, z0, window, grid, use_cache=False, filters=FILTERS
  )
  np.testing.assert_array_equal(mine, want)
  assert got.shape == (4, 12) and int(got.max()) < V


def test_alpha_grid_agrees_with_the_time_grid():
  """make_alpha_grid(alpha(t)) = make_grid(t) (reveal/remask constants)."""
  t = grid_lib.uniform_times(16)
  for cap in (None, np.full(16, 0.1)):
    by_t = grid_lib.make_grid(PROCESS, t, sigma_cap=cap)
    by_a = grid_lib.make_alpha_grid(
      PROCESS, grid_lib.alphas(PROCESS, t), sigma_cap=cap
    )
    np.testing.assert_allclose(by_a.p_unmask, by_t.p_unmask, atol=1e-6)
    np.testing.assert_allclose(by_a.sigma, by_t.sigma, atol=1e-7)
    np.testing.assert_allclose(by_a.t, by_t.t, atol=1e-5)


def _fake_model():
  """Time-free toy denoiser whose prediction depends on the state."""

  def apply(z_BxL, t_B):
    del t_B
    pos = jnp.arange(z_BxL.shape[1]) % V
    shift = jnp.sum(z_BxL == V, -1) % V
    return (
      jax.nn.one_hot(pos, V)[None] + 0.5 * jax.nn.one_hot(shift, V)[:, None]
    )

  return apply


def test_monte_carlo_masked_fraction_and_final_reveals():
  """Run the chain on B x L = 4096 positions, recording the state per step.

  Per step, the masked fraction of 4096 independent positions has standard
  deviation sqrt(q (1 - q) / 4096) <= 0.0047 at q = 0.1 (each position's
  chain is independent of the others given the grid); each step is checked
  within 5 sd (false-alarm probability < 1e-6 per step), the loop mean
  within 4 sd (the steps are correlated, so the mean's sd is at most one
  step's). Reveals in a final step: binomial over the 4096 positions, 5 sd
  as well.
  """
  steps, alpha_on, eta = 24, 0.9, 0.1
  batch, length = 256, 16
  sampler = ReMDMSampler(
    num_steps=steps, eta=eta, strategy='loop', alpha_on=alpha_on
  )
  grid = sampler.grid(PROCESS)
  n_on, n_loop, n_off = loop_phase_steps(steps, 0.55, 0.05)
  states = []
  model = _fake_model()

  def recording(z_BxL, t_B):
    jax.debug.callback(lambda z: states.append(np.asarray(z)), z_BxL)
    return model(z_BxL, t_B)

  z0 = jnp.full((batch, length), V, jnp.int32)
  fill = jax.jit(
    lambda key: grid_lib.stepwise_fill(
      (recording,),
      key,
      PROCESS,
      z0,
      jnp.ones_like(z0, bool),
      grid,
      use_cache=False,
      filters=FILTERS,
    )
  )
  final, nfe = fill(jax.random.key(0))
  jax.effects_barrier()
  assert len(states) == steps == int(nfe[0])
  states.append(np.asarray(final))
  frac = np.array([(s == V).mean() for s in states])
  n = batch * length
  q = 1 - alpha_on
  sd = math.sqrt(q * (1 - q) / n)
  loop = frac[n_on : n_on + n_loop + 1]
  assert np.all(np.abs(loop - q) < 5 * sd), (loop, q)
  assert abs(loop.mean() - q) < 4 * sd
  # Remasking happened (eta = 0.1 <= (1 - 0.9) / 0.9): some revealed token
  # went back to the mask during the loop.
  back = [
    ((a != V) & (b == V)).sum()
    for a, b in zip(states[n_on:], states[n_on + 1 : n_on + n_loop + 1])
  ]
  assert sum(back) > 0
  # Final stretch: no remasking, so each position is revealed at step i
  # with probability exactly delta alpha = (1 - alpha_on) / n_off,
  # independently of the others: the count over n positions is binomial.
  delta = q / n_off
  sd_rev = math.sqrt(length * delta * (1 - delta) / batch)
  for i in range(n_on + n_loop, steps):
    revealed = ((states[i] == V) & (states[i + 1] != V)).sum() / batch
    assert abs(revealed - length * delta) < 5 * sd_rev, (i, revealed)
  assert frac[-1] == 0.0


@pytest.mark.parametrize('bad', [0.0, 1.0, -0.2, 1.5])
def test_alpha_on_outside_the_open_unit_interval_is_refused(bad):
  with pytest.raises(ValueError, match='alpha_on must be in'):
    ReMDMSampler(strategy='loop', alpha_on=bad)


def test_alpha_grid_errors_and_spec_parsing():
  with pytest.raises(ValueError, match='non-decreasing'):
    grid_lib.make_alpha_grid(PROCESS, np.array([0.0, 0.5, 0.4, 1.0]))
  with pytest.raises(ValueError, match='T \\+ 1 >= 2'):
    grid_lib.make_alpha_grid(PROCESS, np.array([0.0]))
  name, params = parse_spec('remdm:eta=0.02,strategy=loop,alpha_on=0.8')
  sampler = get_sampler(name, **params)
  assert sampler.alpha_on == 0.8 and sampler.strategy == 'loop'
  with pytest.raises(ValueError, match='alpha_on'):
    get_sampler('remdm', strategy='loop', alpha_on=1.0)
