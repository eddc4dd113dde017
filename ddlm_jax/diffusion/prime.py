"""MDM-Prime: masked diffusion over sub-tokens (partial masking).

MDM-Prime (Chao et al., arXiv 2505.18495) writes each token id x < V as l
base-b digits, b = ceil(V^(1/l)) (most significant first), and runs
masked diffusion on the L * l sub-tokens: each sub-token independently
keeps its digit with probability alpha(t) and is otherwise masked (the
sub-token mask is the digit value b). A token is then masked, unmasked,
or in between (some digits known). l = 1 is MDLM.

Network. The denoiser still predicts tokens: logits over the V data
tokens, and carry-over sets to -inf every token whose digits disagree
with an observed sub-token (`carry_over`), so p_theta(x^i | y_t) is a
distribution over the tokens consistent with y_t^i (MDLM's SUBS when l =
1). The network reads y_t through `network_input`: each sub-token slot
j has its own b + 1 rows of the embedding table, and a token's input is
the sum of its l slot embeddings (the soft-input path of
`Transformer.embed`: a multi-hot row times the table). The paper
concatenates l embeddings of width d / l; a sum of full-width slot
embeddings contains that as the case where slot j's rows vanish outside
its d / l columns, so it is at least as expressive, with l times the
(small) table: l (b + 1) rows instead of V + 1.

Bound. The continuous-time NELBO of masked diffusion over the sub-token
sequence, with the sub-token marginals of the token prediction:

  -log p(x) <= sum_{sub-tokens} [ alpha(1) log b                (prior)
                                + (1 - alpha(t_lo)) log b ]     (recon.)
     + int_{t_lo}^1 w(t) E_{q(y_t | x)} [ sum_{(i, j) masked in y_t}
                                 -log p_theta(y^{ij} | y_t) ] dt,

  w(t) = -alpha'(t) / (1 - alpha(t)),
  p_theta(y^{ij} = d | y_t) = sum_{x : digit_j(x) = d} p_theta(x | y_t).

The prior and reconstruction terms are MDLM's per sub-token (uniform
prior and decoder over the b digits), so l = 1 is MDLM's full bound
exactly. The integrand needs the sub-token marginals, not the token
probability: in continuous time one sub-token is revealed at a time, and
the rate of revealing digit d at (i, j) is w(t) p_theta(y^{ij} = d | y_t).
Averaging over t turns the bound into the uniform average over orders of
the sub-tokens of the chain rule (the weight of a masked set of size m of
N = L l sub-tokens is B(m, N - m + 1) = (m - 1)! (N - m)! / N!), so with
the tight schedule (alpha(0) = 1, alpha(1) = 0, t_lo = 0) and the exact
posterior as denoiser the bound equals -log p(x) for every x
(tests/test_mdm_prime.py checks this by enumeration). The tempting
per-token form, w(t) sum_i 1[x^i partly masked] -log p_theta(x^i | y_t),
is not a bound for l > 1: with the exact posterior on two correlated
digits it is -log p(x) - PMI(y^1; y^2) / 2, below the likelihood on
average (the same test shows it).

The reverse process (`ddlm_jax.sampling.prime`): from t to s < t, draw
x^i ~ p_theta(x^i | y_t) per token and reveal each masked sub-token with
probability (alpha(s) - alpha(t)) / (1 - alpha(t)) as the digit of the
drawn token. A step that reveals no digit leaves y unchanged, so a
time-free network need not be called again.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.diffusion.base import (
  Backbone,
  DiffusionProcess,
  ProcessConfig,
  ScheduledConfig,
)
from ddlm_jax.diffusion.masked import antithetic_uniform, check_loss_and_times
from ddlm_jax.diffusion.schedules import Schedule

FAMILY = 'mdm_prime'


# ------------------------------------------------------- sub-tokenising --


def subtoken_base(vocab_size: int, subtokens: int) -> int:
  """b: the smallest base with b^l >= V (= ceil(V^(1/l)), exactly)."""
  if vocab_size < 2:
    raise ValueError(f'vocab_size must be >= 2, got {vocab_size}.')
  base = max(2, math.ceil(vocab_size ** (1.0 / subtokens)))
  while (base - 1) ** subtokens >= vocab_size and base > 2:
    base -= 1  # Float rounding can land one above.
  while base**subtokens < vocab_size:
    base += 1  # ... or one below.
  return base


def binary_subtokens(vocab_size: int) -> int:
  """ceil(log2 V): the sub-token count of the binary (b = 2) encoding."""
  return max(1, (int(vocab_size) - 1).bit_length())


def digit_table(vocab_size: int, base: int, subtokens: int) -> np.ndarray:
  """[V, l] int32: the digits of every token, most significant first."""
  ids_V = np.arange(vocab_size)
  powers_S = base ** np.arange(subtokens - 1, -1, -1)
  return ((ids_V[:, None] // powers_S[None, :]) % base).astype(np.int32)


def encode(x_BxL: jax.Array, base: int, subtokens: int) -> jax.Array:
  """Token ids [...] -> digits [..., l], most significant first."""
  powers_S = base ** jnp.arange(subtokens - 1, -1, -1, dtype=jnp.int32)
  return (x_BxL[..., None] // powers_S) % base


def decode(y_BxLxS: jax.Array, base: int) -> jax.Array:
  """Digits [..., l] (no masks) -> token ids [...]."""
  subtokens = y_BxLxS.shape[-1]
  powers_S = base ** jnp.arange(subtokens - 1, -1, -1, dtype=jnp.int32)
  return jnp.sum(y_BxLxS * powers_S, axis=-1)


def consistent(
  y_BxLxS: jax.Array, digits_VxS: jax.Array, mask_value: int
) -> jax.Array:
  """[B, L, V] bool: tokens whose digits agree with every observed one."""
  ok_BxLxV = jnp.ones(y_BxLxS.shape[:-1] + (digits_VxS.shape[0],), bool)
  for j in range(y_BxLxS.shape[-1]):  # l passes over [B, L, V], not l x.
    y_BxLx1 = y_BxLxS[..., j : j + 1]
    ok_BxLxV &= (y_BxLx1 == mask_value) | (digits_VxS[:, j] == y_BxLx1)
  return ok_BxLxV


def carry_over(
  logits_BxLxV: jax.Array,
  y_BxLxS: jax.Array,
  digits_VxS: jax.Array,
  mask_value: int,
) -> jax.Array:
  """Logits with -inf on every token inconsistent with the observed digits."""
  ok_BxLxV = consistent(y_BxLxS, digits_VxS, mask_value)
  return jnp.where(ok_BxLxV, logits_BxLxV.astype(jnp.float32), -jnp.inf)


def subtoken_log_likelihood(
  logp_BxLxV: jax.Array, y0_BxLxS: jax.Array, digits_VxS: jax.Array
) -> jax.Array:
  """[B, L, l]: log p(y^{ij} = y0^{ij}), the token log-probs marginalised.

  One masked log-sum-exp per slot over the tokens with that digit. The
  set always holds a token of positive probability when y0 is the digits
  of a token consistent with the input (the case of the bound), so no
  log-sum-exp runs over -inf alone and gradients stay finite.
  """
  out = []
  for j in range(y0_BxLxS.shape[-1]):
    match_BxLxV = digits_VxS[:, j] == y0_BxLxS[..., j : j + 1]
    out.append(
      jax.nn.logsumexp(jnp.where(match_BxLxV, logp_BxLxV, -jnp.inf), axis=-1)
    )
  return jnp.stack(out, axis=-1)


# -------------------------------------------------------------- process --


@dataclasses.dataclass(frozen=True)
class PrimeDiffusion(DiffusionProcess):
  """Masked diffusion over l base-b sub-tokens per token (module docstring).

  Attributes:
    schedule: the keep-probability alpha(t) of every sub-token.
    vocab_size: V data tokens.
    subtokens: l >= 1 digits per token (1 is MDLM).
    t_min: times are drawn from [t_min, 1].
    antithetic: stratify the batch's times (MD4).
    loss_type: 'elbo' trains on the NELBO, 'simple_ce' on the unweighted
      cross-entropy of the masked sub-tokens; both report the NELBO.

  States: y [B, L, l] int32, digits in [0, b) and the sub-token mask b.
  The token-level generate id is V (every digit of the position masked).
  """

  schedule: Schedule
  vocab_size: int
  subtokens: int = 2
  t_min: float = 0.0
  antithetic: bool = True
  loss_type: str = 'elbo'

  causal: ClassVar[bool] = False
  family: ClassVar[str] = FAMILY
  requires_time_conditioning: ClassVar[bool] = False

  def __post_init__(self):
    if isinstance(self.subtokens, bool) or not isinstance(self.subtokens, int):
      raise ValueError(f'subtokens must be an int, got {self.subtokens!r}.')
    if self.subtokens < 1:
      raise ValueError(
        f'subtokens must be >= 1 (1 is MDLM), got {self.subtokens}.'
      )
    if self.vocab_size < 2:
      raise ValueError(f'vocab_size must be >= 2, got {self.vocab_size}.')
    check_loss_and_times(self.loss_type, self.t_min)

  # --- shapes and ids

  @property
  def base(self) -> int:
    """b = ceil(V^(1/l)); also the sub-token mask value."""
    return subtoken_base(self.vocab_size, self.subtokens)

  @property
  def mask_id(self) -> int:
    """The token-level id of a fully masked position (V)."""
    return self.vocab_size

  @property
  def slot_rows(self) -> int:
    """Embedding rows the sub-token slots use: l (b + 1)."""
    return self.subtokens * (self.base + 1)

  @property
  def input_vocab_size(self) -> int:
    """Rows of the network's input table: the slot rows, at least V (the
    backbone's table has >= V rows; with l >= 2 the rows past l (b + 1)
    are never read)."""
    return max(self.vocab_size, self.slot_rows)

  @property
  def digits(self) -> jax.Array:
    """[V, l]: every token's digits."""
    return jnp.asarray(digit_table(self.vocab_size, self.base, self.subtokens))

  def encode(self, x_BxL: jax.Array) -> jax.Array:
    """Token ids -> digits [B, L, l]; the generate id V -> all masked."""
    y_BxLxS = encode(jnp.minimum(x_BxL, self.vocab_size - 1), self.base,
                     self.subtokens)  # fmt: skip
    return jnp.where((x_BxL == self.mask_id)[..., None], self.base, y_BxLxS)

  def decode(self, y_BxLxS: jax.Array) -> jax.Array:
    """Digits -> token ids; a position with any digit masked -> V."""
    masked_BxL = jnp.any(y_BxLxS == self.base, axis=-1)
    x_BxL = decode(jnp.where(y_BxLxS == self.base, 0, y_BxLxS), self.base)
    return jnp.where(masked_BxL, self.mask_id, x_BxL)

  def network_input(self, y_BxLxS: jax.Array) -> jax.Array:
    """[B, L, input_vocab_size] float: one row per slot and state summed
    (row j (b + 1) + y^j), the multi-hot the embedding table multiplies."""
    width = self.base + 1
    onehot_BxLxSxW = jax.nn.one_hot(y_BxLxS, width, dtype=jnp.float32)
    rows_BxLxR = onehot_BxLxSxW.reshape(y_BxLxS.shape[:-1] + (-1,))
    pad = self.input_vocab_size - self.slot_rows
    return jnp.pad(rows_BxLxR, ((0, 0), (0, 0), (0, pad)))

  # --- forward process

  def time_weight(self, t_B: jax.Array) -> jax.Array:
    """(1 - t_min) w(t): its mean over t ~ U[t_min, 1] is the integral."""
    weight_B = self.schedule.weight(t_B)
    if self.t_min > 0.0:
      weight_B = (1.0 - self.t_min) * weight_B
    return weight_B

  def sample_times(self, key: jax.Array, batch: int):
    """(t_B, weight_B) with t ~ U[t_min, 1], stratified if antithetic."""
    if self.antithetic:
      u_B = antithetic_uniform(key, batch)
    else:
      u_B = jax.random.uniform(key, (batch,))
    t_B = self.t_min + (1.0 - self.t_min) * u_B
    return t_B, self.time_weight(t_B)

  def corrupt(self, key: jax.Array, x_BxL: jax.Array, t_B) -> jax.Array:
    """y_t [B, L, l]: every digit masked independently w.p. 1 - alpha(t)."""
    y_BxLxS = self.encode(x_BxL)
    alpha_Bx1x1 = jnp.asarray(self.schedule.alpha(t_B))[:, None, None]
    keep_BxLxS = jax.random.uniform(key, y_BxLxS.shape) < alpha_Bx1x1
    return jnp.where(keep_BxLxS, y_BxLxS, self.base)

  def draw(self, key: jax.Array, x_BxL: jax.Array):
    t_key, mask_key = jax.random.split(key)
    t_B, weight_B = self.sample_times(t_key, x_BxL.shape[0])
    return t_B, weight_B, self.corrupt(mask_key, x_BxL, t_B)

  def network_logits(self, apply, z_BxLxS, x_BxL, t_B) -> jax.Array:
    del x_BxL
    return apply(self.network_input(z_BxLxS), t_B)

  def forward_marginal(self, x_probs_BxLxV, alpha):
    """Refused: q(y_t | x) lives on l digits per token, not on V + 1 ids,
    so the absorbing default would be silently wrong here."""
    del x_probs_BxLxV, alpha
    raise TypeError(
      'PrimeDiffusion has partially masked tokens: q(y_t | x) is over l '
      'sub-tokens per token (see corrupt), not over V + 1 ids; samplers '
      "of family 'mdm_prime' do not need it."
    )

  def prior_sample(self, key: jax.Array, shape) -> jax.Array:
    """Token-level ids of y_1: every position fully masked (V)."""
    del key
    return jnp.full(shape, self.mask_id, jnp.int32)

  # --- the denoiser and the bound

  def denoiser_log_probs(self, logits_BxLxV, z_BxLxS, t_B) -> jax.Array:
    """log p_theta(x^i | y_t) over V, with carry-over."""
    del t_B
    logits_BxLxV = carry_over(logits_BxLxV, z_BxLxS, self.digits, self.base)
    return jax.nn.log_softmax(logits_BxLxV, axis=-1)

  def constant_nats(self) -> tuple[float, float]:
    """(reconstruction, prior) nats per sub-token: ((1 - alpha(t_min)) log
    b, alpha(1) log b), MDLM's full-bound terms over b digit values."""
    with jax.ensure_compile_time_eval():
      a_lo = float(self.schedule.alpha(float(self.t_min)))
      a_1 = float(self.schedule.alpha(1.0))
    log_b = math.log(self.base)
    return (1.0 - a_lo) * log_b, a_1 * log_b

  def bound(self, logits_BxLxV, x_BxL, z_BxLxS, t_B, weight_B, loss_mask_BxL):
    """(objective_B, nelbo_B, aux) of one prediction at y_t."""
    batch, length = x_BxL.shape
    valid_BxL = jnp.ones((batch, length), jnp.float32)
    if loss_mask_BxL is not None:
      valid_BxL = loss_mask_BxL.astype(jnp.float32)
    masked_BxLxS = (z_BxLxS == self.base) & (valid_BxL[..., None] > 0)
    logp_BxLxV = self.denoiser_log_probs(logits_BxLxV, z_BxLxS, t_B)
    y0_BxLxS = encode(x_BxL, self.base, self.subtokens)
    ll_BxLxS = subtoken_log_likelihood(logp_BxLxV, y0_BxLxS, self.digits)
    ce_B = -jnp.sum(jnp.where(masked_BxLxS, ll_BxLxS, 0.0), axis=(1, 2))
    valid_B = valid_BxL.sum(-1)
    recon, prior = self.constant_nats()
    nelbo_B = weight_B * ce_B + (recon + prior) * self.subtokens * valid_B
    objective_B = nelbo_B if self.loss_type == 'elbo' else ce_B
    masked_B = masked_BxLxS.sum((1, 2)).astype(jnp.float32)
    aux = {
      'masked_fraction': masked_B / (self.subtokens * valid_B),
      't': t_B,
    }
    return objective_B, nelbo_B, aux


# --------------------------------------------------------------- config --


@ProcessConfig.register(FAMILY)
@dataclasses.dataclass(frozen=True)
class PrimeConfig(ScheduledConfig):
  """config.process of MDM-Prime.

  subtokens: l digits per token (1 is MDLM); binary: l = ceil(log2 V),
  b = 2 (then leave subtokens at its default); the shared settings as in
  ScheduledConfig (t_min 1e-3 and the log-linear schedule, as MDLM).
  """

  subtokens: int = 2
  binary: bool = False

  family: ClassVar[str] = FAMILY

  def __post_init__(self):
    if self.binary and self.subtokens != 2:
      raise ValueError(
        f'process.binary=True sets the sub-token count to ceil(log2 V); '
        f'process.subtokens={self.subtokens} contradicts it. Set one of '
        'them (leave subtokens at 2 with binary=True).'
      )

  def check(self, backbone: Backbone, seq_len: int) -> None:
    super().check(backbone, seq_len)
    if backbone.name != 'transformer':
      raise ValueError(
        f'process.kind={self.kind!r} feeds the network sub-token rows '
        f'through the transformer embedding; model.backbone='
        f'{backbone.name!r} cannot take them. Use '
        "model.backbone='transformer'."
      )

  def build(self, vocab_size: int) -> PrimeDiffusion:
    subtokens = binary_subtokens(vocab_size) if self.binary else self.subtokens
    return PrimeDiffusion(
      **self.scheduled_kwargs(vocab_size), subtokens=subtokens
    )
