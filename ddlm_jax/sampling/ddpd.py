"""DDPD's planned sampler: a planner picks, a mask denoiser fills.

Discrete Diffusion with Planned Denoising (arXiv 2410.06264) generates
with two networks: the planner of a `ddpd_planner` run (one noise logit
per position, `ddlm_jax.diffusion.ddpd`) and the denoiser of a masked
diffusion run (MDLM or MD4 over the same tokenizer, mask id V). From
uniform tokens, each of T steps

  1. calls the planner on x and picks ONE position d to denoise, with
     probability softmax(logits / plan_temperature) over the positions
     being generated;
  2. masks every position the planner believes is noise (a Bernoulli of
     its sigmoid; d is always masked) and calls the denoiser on that
     input at the masked fraction t = |M| / L (the paper's time 1 -
     |M| / L, in this suite's convention where t = 1 is all masked);
  3. resamples x^d from the denoiser's prediction at d.

With `parallel`, step i denoises k_i positions instead of one: k_i =
n_i / (T - i) rounded to the nearest integer (at least 1), where n_i is
the planner's estimate of the noisy positions left (the sum of its
sigmoids; rounded, not ceiled, so that a sum a hair above an integer
does not take one position more), drawn without replacement in
proportion to softmax(logits / plan_temperature) (Gumbel top-k). That is
the paper's few-step sampler (its ImageNet code: the scheduled
decrement of the masked count, scaled by the planner's noise estimate),
with a linear schedule; with a perfect planner it reaches every noisy
position in T steps, where one position per step needs T >= L.

A final pass (`final_pass`) calls the planner once more, masks every
position whose noise probability exceeds `final_fill_prob` and fills all
of them from one denoiser call, with its most likely token
(`final_greedy`) or a draw. That is the paper's end of sampling (its
text8 sampler: threshold 0.05, argmax), with two differences: the
paper reads the noise probabilities and the denoiser's prediction from
the last step's calls, where this pass calls both networks on the final
state (a position that step changed is judged afresh), and the paper
does not count the pass. A Bernoulli draw of the flags here, as in the
steps, would leave a position the planner gives noise probability 0.3
as uniform noise seven times in ten: a weak planner's samples then keep
a floor of noise that no denoiser temperature removes.

A position can be picked again after it was denoised: the planner can
call any token noise, which is DDPD's self-correction. Every step calls
both networks, so NFE = (T + 1, T + 1) (planner calls, denoiser calls)
with the final pass; FLOPs add both networks' costs.

`planned_denoise` is the loop as a pure function of a planner callable
`plan(x_BxL, clean_BxL)`: `clean_BxL` marks the positions the loop has
denoised so far (and the fixed prompt), the latent data/noise state of
the reverse process. The network planner ignores it (it estimates that
state from x alone); an oracle planner that reads it turns the loop into
random-order autoregressive sampling, exact for an exact denoiser once T
>= L, which is what tests/test_ddpd.py checks by enumeration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.ddpd import FAMILY, PlannerProcess
from ddlm_jax.sampling.base import Sampler, check_family, require_int
from ddlm_jax.sampling.noise import filter_logits, sample_categorical

# plan(x_BxL, clean_BxL) -> noise logits [B, L] float32.
PlanFn = Callable[[jax.Array, jax.Array], jax.Array]
# denoise(z_BxL, t_B) -> log p(x^i | z) over the V data tokens [B, L, V].
DenoiseFn = Callable[[jax.Array, jax.Array], jax.Array]


def planned_denoise(
  plan: PlanFn,
  denoise: DenoiseFn,
  key: jax.Array,
  x_BxL: jax.Array,
  todo_BxL: jax.Array,
  *,
  num_steps: int,
  mask_id: int,
  plan_temperature: float = 1.0,
  filters: dict | None = None,
  final_pass: bool = True,
  parallel: bool = False,
  final_fill_prob: float = 0.05,
  final_greedy: bool = True,
):
  """Runs DDPD's loop on x (module docstring): (x_BxL, nfe_2).

  Args:
    plan: the planner (noise logits; may read the loop's clean record).
    denoise: the mask denoiser's log-probabilities over V.
    x_BxL: the start state; positions in todo_BxL hold uniform noise.
    todo_BxL: the positions to generate (the rest stay fixed).
    num_steps: T planner-denoiser steps.
    mask_id: the denoiser's mask id.
    plan_temperature: divides the planner logits before the softmax that
      picks the position.
    filters: temperature / top_k / top_p of the denoiser draws.
    final_pass: fill the positions still flagged after the T steps.
    parallel: denoise round(n_i / (T - i)) positions at step i (module
      docstring) instead of one.
    final_fill_prob: the final pass fills the positions whose noise
      probability exceeds it.
    final_greedy: the final pass takes the denoiser's most likely token
      (else a draw filtered like the steps').

  Returns:
    The tokens and NFE as int32 [2]: (planner calls, denoiser calls).
  """
  filters = dict(filters or {})
  batch, length = x_BxL.shape
  rows_B = jnp.arange(batch)

  def flagged(key, logits_BxL):
    noise_BxL = jax.random.bernoulli(key, jax.nn.sigmoid(logits_BxL))
    return noise_BxL & todo_BxL

  def draw(key, x_BxL, masked_BxL, greedy=False):
    z_BxL = jnp.where(masked_BxL, mask_id, x_BxL)
    t_B = masked_BxL.sum(-1).astype(jnp.float32) / length
    logp_BxLxV = denoise(z_BxL, t_B)
    if greedy:
      return jnp.argmax(logp_BxLxV, axis=-1)
    return sample_categorical(key, filter_logits(logp_BxLxV, **filters))

  def step(carry, i):
    x_BxL, clean_BxL = carry
    pick_key, flag_key, draw_key = jax.random.split(
      jax.random.fold_in(key, i), 3
    )
    logits_BxL = plan(x_BxL, clean_BxL).astype(jnp.float32)
    choice_BxL = jnp.where(todo_BxL, logits_BxL / plan_temperature, -jnp.inf)
    if parallel:
      noisy_B = jnp.where(todo_BxL, jax.nn.sigmoid(logits_BxL), 0.0).sum(-1)
      count_B = jnp.floor(noisy_B / (num_steps - i) + 0.5).astype(jnp.int32)
      picked_BxL = gumbel_top_k(pick_key, choice_BxL, jnp.maximum(count_B, 1))
      picked_BxL &= todo_BxL
    else:
      d_B = jax.random.categorical(pick_key, choice_BxL, axis=-1)
      picked_BxL = jnp.zeros_like(todo_BxL).at[rows_B, d_B].set(True)
    masked_BxL = flagged(flag_key, logits_BxL) | picked_BxL
    new_BxL = draw(draw_key, x_BxL, masked_BxL)
    x_BxL = jnp.where(picked_BxL, new_BxL.astype(x_BxL.dtype), x_BxL)
    clean_BxL = clean_BxL | picked_BxL
    return (x_BxL, clean_BxL), None

  carry = (x_BxL, ~todo_BxL)
  (out_BxL, clean_BxL), _ = jax.lax.scan(
    step, carry, jnp.arange(num_steps, dtype=jnp.int32)
  )
  calls = num_steps
  if final_pass:
    draw_key = jax.random.fold_in(key, num_steps)
    logits_BxL = plan(out_BxL, clean_BxL).astype(jnp.float32)
    masked_BxL = (jax.nn.sigmoid(logits_BxL) > final_fill_prob) & todo_BxL
    new_BxL = draw(draw_key, out_BxL, masked_BxL, greedy=final_greedy)
    out_BxL = jnp.where(masked_BxL, new_BxL.astype(out_BxL.dtype), out_BxL)
    calls += 1
  # A row with nothing to generate picks among -inf logits; its draw is
  # undone here, as every fixed position is.
  out_BxL = jnp.where(todo_BxL, out_BxL, x_BxL)
  nfe_2 = jnp.full((2,), calls, jnp.int32)
  return out_BxL, nfe_2


def gumbel_top_k(key, logits_BxL, k_B):
  """k_B positions per row drawn without replacement, each draw in
  proportion to softmax(logits) over the positions left: the top k of
  logits + Gumbel noise. -inf logits are never drawn. Returns bool [B, L].
  """
  scores_BxL = logits_BxL + jax.random.gumbel(key, logits_BxL.shape)
  rank_BxL = jnp.argsort(jnp.argsort(-scores_BxL, axis=-1), axis=-1)
  return (rank_BxL < k_B[:, None]) & jnp.isfinite(logits_BxL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DDPDSampler(Sampler):
  """DDPD's planned sampler; apply = (planner_apply, denoiser_apply).

  The run that samples is the planner's (family 'ddpd_planner'); the
  denoiser is a masked diffusion run over the same tokenizer, named by
  config.sample.light_workdir (the second network of a two-network
  sampler). Temperature, top_k and top_p filter the denoiser's draws.

  Attributes:
    num_steps: T planner-denoiser steps (each calls both networks).
    plan_temperature: divides the planner logits in the softmax that
      picks the position to denoise.
    final_pass: after the T steps, fill every position the planner still
      flags from one more call of each network.
    final_fill_prob: the noise probability above which the final pass
      fills a position (the paper's text8 sampler: 0.05).
    final_greedy: the final pass takes the denoiser's most likely token,
      as the paper's does; False draws it with the steps' filters.
    parallel: denoise round(n_i / (T - i)) positions per step, n_i the
      planner's noise estimate (the paper's few-step sampler); False
      denoises one position per step (its text8 and OpenWebText
      sampler, run there with T >= L).
  """

  name: ClassVar[str] = 'ddpd'
  families: ClassVar[tuple[str, ...]] = (FAMILY,)
  num_models: ClassVar[int] = 2

  num_steps: int = 128
  plan_temperature: float = 1.0
  final_pass: bool = True
  parallel: bool = False
  final_fill_prob: float = 0.05
  final_greedy: bool = True

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 1)
    if not float(self.plan_temperature) > 0:
      raise ValueError(
        f'plan_temperature must be > 0, got {self.plan_temperature}; for a '
        'near-greedy choice of position use a small value such as 1e-3.'
      )
    if not 0.0 <= float(self.final_fill_prob) < 1.0:
      raise ValueError(
        f'final_fill_prob must be in [0, 1), got {self.final_fill_prob}: the '
        'final pass fills the positions whose noise probability exceeds it '
        '(the paper uses 0.05; final_pass=False skips the pass).'
      )
    self._set(
      final_pass=bool(self.final_pass),
      parallel=bool(self.parallel),
      final_fill_prob=float(self.final_fill_prob),
      final_greedy=bool(self.final_greedy),
    )

  def check_applies(self, process) -> None:
    # The planner is a process but not a diffusion one (no schedule, no
    # bound), so the base class's diffusion check does not apply; the
    # family check does.
    check_family(self, process)
    if not isinstance(process, PlannerProcess):
      raise TypeError(
        f'{self.name} needs a ddlm_jax.diffusion.ddpd.PlannerProcess (the '
        f'planner run samples); got {type(process).__name__}.'
      )

  def fill(self, apply, key, process: PlannerProcess, z_BxL, window_BxL):
    """Fills the generate-id positions in the window: (z_BxL, nfe_2)."""
    planner, denoiser = self._applies(apply)
    vocab = process.vocab_size
    todo_BxL = (z_BxL == process.generate_id) & window_BxL
    prior_key, loop_key = jax.random.split(key)
    noise_BxL = jax.random.randint(prior_key, z_BxL.shape, 0, vocab)
    x_BxL = jnp.where(todo_BxL, noise_BxL, z_BxL).astype(jnp.int32)

    def plan(x_BxL, clean_BxL):
      del clean_BxL  # The network estimates it from x.
      return process.noise_logits(planner, x_BxL)

    def denoise(z_BxL, t_B):
      logits_BxLxV = denoiser(z_BxL, t_B)
      if logits_BxLxV.shape[-1] != vocab:
        raise ValueError(
          f'the denoiser predicts {logits_BxLxV.shape[-1]} tokens, the '
          f'planner run has {vocab}: train both on the same tokenizer '
          '(sample.light_workdir names the masked-diffusion run).'
        )
      return jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), -1)

    out_BxL, nfe_2 = planned_denoise(
      plan,
      denoise,
      loop_key,
      x_BxL,
      todo_BxL,
      num_steps=self.num_steps,
      mask_id=vocab,
      plan_temperature=float(self.plan_temperature),
      filters=self.filters,
      final_pass=self.final_pass,
      parallel=self.parallel,
      final_fill_prob=self.final_fill_prob,
      final_greedy=self.final_greedy,
    )
    return out_BxL.astype(z_BxL.dtype), nfe_2
