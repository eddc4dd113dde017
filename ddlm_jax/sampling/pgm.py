"""PGM's sampler: a random order, the next positions asked as queries.

Partition Generative Modeling generates like an any-order autoregressive
model whose steps decode several positions at once. Each row draws a
random order of the positions to generate (those holding the generate id;
prompt positions come first, in place). Step j of T decodes the next
floor((j + 1) n / T) - floor(j n / T) positions of the order (n positions
in all; L / T when T divides L): the encoder runs on the clean tokens so
far (self-attention among them, each at its true position), the decoder
asks the step's positions as position-only queries against those encoder
outputs, and the drawn tokens join the clean ones. The first step of an
unprompted row has no clean token: its queries read the decoder's sink
alone (the empty prefix; no BOS is needed).

A query's prediction depends only on the clean tokens, never on the other
queries (the decoder has no self-attention), so this is exactly the
reverse process of MDLM's bound taken with the training network: at each
step the positions still to be generated form the group the decoder
predicts from the group of clean ones.

Cost. The encoder input grows like an autoregressive prefix. Under jit
every shape is static, so the steps are grouped into `buckets` encoder
lengths (steps with up to C clean tokens run the encoder on C slots with
the rest masked as padding): compiled programs stay few, and the encoder
work is about L T / 2 tokens plus the padding, against L T for a masked
diffusion model that runs its whole network on all L positions every
step. NFE counts decoder calls: T when n >= T. `generate` also returns the
work done (`PGMCost`), and `estimate_flops` turns it into FLOPs for
`--mode=sample`'s statistics.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.pgm import FAMILY, PGMDiffusion
from ddlm_jax.sampling.base import Sampler, require_int
from ddlm_jax.sampling.common import initial_state
from ddlm_jax.sampling.noise import filter_logits, sample_categorical


class PGMCost(NamedTuple):
  """Work per row of one `generate` call (float32 scalars).

  Attributes:
    encoder_tokens: tokens through the encoder's layers (padding too).
    encoder_pairs: query-key pairs per encoder layer.
    decoder_queries: queries through the decoder and the head.
    decoder_keys: encoder outputs (and sinks) projected to keys and
      values, per decoder layer.
    decoder_pairs: query-key pairs per decoder layer.
  """

  encoder_tokens: jax.Array
  encoder_pairs: jax.Array
  decoder_queries: jax.Array
  decoder_keys: jax.Array
  decoder_pairs: jax.Array


class PGMSample(NamedTuple):
  """What `PGMSampler.generate` returns."""

  tokens_BxL: jax.Array  # noqa: N815
  nfe: jax.Array
  cost: PGMCost


def estimate_flops(cfg, cost: PGMCost, batch: int) -> float:
  """FLOPs of the work in `cost` for `batch` rows of a PGM network.

  The terms of evaluation.cost.transformer_flops (2 FLOPs per multiply-
  add; norms, softmax and rotary left out): per encoder token the Q/K/V/O
  projections, the MLP and the one-hot embedding; per decoder query the
  group swap's projection, Q and O, the MLP and the head; per memory
  token K and V in every decoder layer; per attended pair QK^T and AV.

  Args:
    cfg: a ddlm_jax.models.pgm.PGMConfig.
  """
  from ddlm_jax.models.transformer import ONE_HOT_EMBED_MAX_VOCAB

  d, h = cfg.width, cfg.hidden_dim
  mlp = (3 if cfg.mlp_kind == 'swiglu' else 2) * d * h
  encoder = cfg.encoder_depth * (4 * d * d + mlp)
  if cfg.vocab_size <= ONE_HOT_EMBED_MAX_VOCAB:
    encoder += d * cfg.vocab_size
  query = d * d + cfg.decoder_depth * (2 * d * d + mlp) + d * cfg.vocab_size
  total = (
    encoder * float(cost.encoder_tokens)
    + cfg.encoder_depth * 2 * d * float(cost.encoder_pairs)
    + query * float(cost.decoder_queries)
    + cfg.decoder_depth * 2 * d * d * float(cost.decoder_keys)
    + cfg.decoder_depth * 2 * d * float(cost.decoder_pairs)
  )
  return 2.0 * total * batch


def step_bounds(num_steps: int, todo: int) -> list[tuple[int, int]]:
  """[(start, end)] of each step's slots among `todo` positions."""
  return [
    (j * todo // num_steps, (j + 1) * todo // num_steps)
    for j in range(num_steps)
  ]


def encoder_buckets(
  length: int, num_steps: int, buckets: int, known: int
) -> list[tuple[int, int, int]]:
  """[(capacity, first step, end step)]: consecutive steps that run the
  encoder on the same number of slots.

  `known` bounds the clean tokens a row starts with (0 unprompted; the
  length when a prompt may hold any number): step j sees at most known +
  floor(j (length - known) / T) of them, rounded up to the grid of
  `buckets` capacities.
  """
  grid = sorted({-(-length * (i + 1) // buckets) for i in range(buckets)})
  out: list[tuple[int, int, int]] = []
  for j in range(num_steps):
    need = min(length, known + j * (length - known) // num_steps)
    cap = next(c for c in grid if c >= max(need, 1))
    if out and out[-1][0] == cap:
      out[-1] = (cap, out[-1][1], j + 1)
    else:
      out.append((cap, j, j + 1))
  return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class PGMSampler(Sampler):
  """Random-order decoding of PGM, L / T positions per step (module
  docstring).

  Attributes:
    num_steps: T decoder calls (the sample block's `steps`).
    buckets: encoder lengths compiled (the padding they cost is at most
      L / buckets tokens per step).
  """

  name: ClassVar[str] = 'pgm'
  families: ClassVar[tuple[str, ...]] = (FAMILY,)

  num_steps: int = 128
  buckets: int = 8

  def __post_init__(self):
    super().__post_init__()
    require_int('num_steps', self.num_steps, 1)
    require_int('buckets', self.buckets, 1)

  def check_applies(self, process) -> None:
    super().check_applies(process)
    if not isinstance(process, PGMDiffusion):
      raise TypeError(
        f'{self.name} needs a ddlm_jax.diffusion.pgm.PGMDiffusion; got '
        f'{type(process).__name__}.'
      )

  def fill(self, apply, key, process: PGMDiffusion, z_BxL, window_BxL):
    """Fills the generate-id positions inside the window: (z_BxL, nfe).

    Any number of positions may be given already (a prompt), so the
    encoder runs on all L slots every step (`generate` of an unprompted
    batch buckets them)."""
    out = self._run(apply, key, process, z_BxL, window_BxL, z_BxL.shape[1])
    return out.tokens_BxL, out.nfe

  def generate(self, apply, key, process, *, batch, length, prompt_BxL=None):
    """Samples with the work done: a `PGMSample`."""
    self.check_applies(process)
    (apply,) = self._applies(apply)
    z_BxL = initial_state(process, batch, length, prompt_BxL)
    window_BxL = jnp.ones((batch, length), bool)
    known = 0 if prompt_BxL is None else length
    return self._run(apply, key, process, z_BxL, window_BxL, known)

  def __call__(self, apply, key, process, *, batch, length, prompt_BxL=None):
    out = self.generate(
      apply, key, process, batch=batch, length=length, prompt_BxL=prompt_BxL
    )
    return out.tokens_BxL, out.nfe

  @staticmethod
  def estimate_flops(cfg, cost: PGMCost, batch: int) -> float:
    """FLOPs of a `generate` call's work (module function)."""
    return estimate_flops(cfg, cost, batch)

  def _run(self, apply, key, process, z_BxL, window_BxL, known: int):
    (net,) = self._applies(apply)
    batch, length = z_BxL.shape
    vocab, steps = process.vocab_size, self.num_steps
    todo_BxL = (z_BxL == process.generate_id) & window_BxL
    n0_B = length - todo_BxL.sum(-1).astype(jnp.int32)  # clean at the start
    todo_B = length - n0_B
    order_key, draw_key = jax.random.split(key)
    # Clean positions first (in place), then the rest in a random order.
    score_BxL = jnp.where(
      todo_BxL, jax.random.uniform(order_key, (batch, length)), -1.0
    )
    order_BxL = jnp.argsort(score_BxL, axis=-1).astype(jnp.int32)
    tokens_BxL = jnp.take_along_axis(z_BxL.astype(jnp.int32), order_BxL, 1)
    per_step = -(-length // steps)
    rows_Bx1 = jnp.arange(batch)[:, None]

    def bounds(j):
      start_B = n0_B + (j * todo_B) // steps
      return start_B, n0_B + ((j + 1) * todo_B) // steps

    def step(j, carry, capacity):
      tokens_BxL, nfe = carry
      start_B, end_B = bounds(j)
      slots_C = jnp.arange(capacity)
      clean_BxC = slots_C[None, :] < start_B[:, None]
      positions_BxC = order_BxL[:, :capacity]
      memory_BxCxD = net.encode(
        jnp.minimum(tokens_BxL[:, :capacity], vocab - 1),
        positions_BxC,
        jnp.where(clean_BxC, 0, 1),
      )
      q_slots_BxK = start_B[:, None] + jnp.arange(per_step)[None, :]
      asked_BxK = q_slots_BxK < end_B[:, None]
      q_pos_BxK = jnp.take_along_axis(
        order_BxL, jnp.minimum(q_slots_BxK, length - 1), 1
      )
      logits_BxKxV = net.decode(
        memory_BxCxD,
        positions_BxC,
        jnp.where(clean_BxC, 1, -1),
        q_pos_BxK,
        jnp.zeros_like(q_pos_BxK),
      )
      filtered = filter_logits(logits_BxKxV, **self.filters)
      new_BxK = sample_categorical(jax.random.fold_in(draw_key, j), filtered)
      write_BxK = jnp.where(asked_BxK, q_slots_BxK, length)  # OOB: dropped
      tokens_BxL = tokens_BxL.at[rows_Bx1, write_BxK].set(
        new_BxK.astype(jnp.int32), mode='drop'
      )
      return tokens_BxL, nfe + jnp.any(asked_BxK).astype(jnp.int32)

    carry = (tokens_BxL, jnp.int32(0))
    work = [0.0] * 5
    for capacity, first, end in encoder_buckets(
      length, steps, self.buckets, known
    ):
      body = lambda j, c, capacity=capacity: step(j, c, capacity)
      carry = jax.lax.fori_loop(first, end, body, carry)
      calls = end - first
      work[0] += calls * capacity
      work[1] += calls * capacity * capacity
      work[2] += calls * per_step
      work[3] += calls * (capacity + 1)
      work[4] += calls * per_step * (capacity + 1)
    tokens_BxL, nfe = carry
    out_BxL = jnp.zeros_like(tokens_BxL).at[rows_Bx1, order_BxL].set(tokens_BxL)
    out_BxL = jnp.where(todo_BxL, out_BxL, z_BxL).astype(z_BxL.dtype)
    cost = PGMCost(*(jnp.float32(w) for w in work))
    return PGMSample(tokens_BxL=out_BxL, nfe=nfe, cost=cost)


__all__ = ['PGMCost', 'PGMSample', 'PGMSampler', 'estimate_flops']
