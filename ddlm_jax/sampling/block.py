"""Block-diffusion (BD3-LM) sampling: blocks left to right, a KV cache.

The sequence is generated block by block. Inside block b any masked-family
sampler (an inner sampler, as in semi_ar) fills the block through its
`fill`, with the network call

  apply(z_BxN, t_B) = model.block_logits(z_BxN, cache, start)

which lets the noisy block at positions start..start+N attend to the clean
keys/values of the finished blocks (cache positions < start) and to itself.
After the block is done, `model.extend_cache` writes its clean keys and
values. With use_kv_cache=False every network call instead runs the 2L
training pass `model(concat(z, x), t, block_size=N)` on the whole sequence
(x: the finished blocks, later positions still masked; z: x with the noisy
block in place) and reads the block's logits: the same function of the same
inputs, so it returns the same tokens for the same key (it checks the cache).

The loop over blocks is a lax.while_loop with a traced start, so compiling
does not grow with the number of blocks, and any number of blocks can be
generated (two or four times the training length: the model has rotary
positions and the cache is sized to the request).

Variable length (BD3-LM's var_length): after each block a row stops when
it produced `eos_id` at a generated (not prompt) position, or when the
unigram entropy (nats) of its last `entropy_window` tokens falls below
`entropy_threshold` (checked once that many tokens exist; BD3-LM: 256
tokens, 4 nats). Positions after a stop are set to `pad_id` (default
`eos_id`); `lengths_B` counts the tokens up to and including the first EOS,
or up to the end of the block where the entropy fell (BD3-LM also drops the
low-entropy window itself: take lengths - entropy_window if you want that).
The loop ends early once every row has stopped. Prompt positions are never
changed, even after a stop.

Prompts: positions that are not the mask id are fixed. A block the prompt
covers entirely (a prefix prompt's first blocks) costs no network call: it
only extends the cache, so the prompt is cached first.

Cost accounting. `nfe` counts the inner sampler's network calls (one per
batched call of block_logits, or of the 2L pass), `extensions` the
extend_cache calls, counted separately because they run the clean block
once through the layers without the output head. `cost` holds, per row,
the tokens run through the layers, the tokens given logits and the
query-key pairs attended (per layer); `estimate_flops` turns them into
FLOPs with the formula of evaluation.cost.transformer_flops. The 2L pass is
counted as what it computes: 2T tokens and (2T)^2 pairs per call.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from ddlm_jax.diffusion.base import BlockProcess
from ddlm_jax.sampling.base import Sampler, build, require_float, require_int
from ddlm_jax.sampling.semi_ar import INNER_SAMPLERS, NON_MASKED_SAMPLERS

STOPS = ('none', 'eos', 'entropy', 'eos+entropy')
# Names an inner sampler may be looked up by; non-masked ones are refused
# with a clear error by `check_inner`.
LOOKUP = {**INNER_SAMPLERS, **NON_MASKED_SAMPLERS}
MODEL_METHODS = ('init_cache', 'block_logits', 'extend_cache')


class Cost(NamedTuple):
  """Work done per row (float32 scalars), for `estimate_flops`.

  Attributes:
    dense_tokens: tokens run through the layers (projections and MLPs).
    head_tokens: tokens whose logits were computed (the output head).
    attention_pairs: query-key pairs attended, per layer.
  """

  dense_tokens: jax.Array
  head_tokens: jax.Array
  attention_pairs: jax.Array

  @classmethod
  def zero(cls) -> Cost:
    return cls(*(jnp.float32(0.0) for _ in range(3)))

  def add(self, calls, queries, keys, head: bool = True) -> Cost:
    """`calls` network calls of `queries` tokens attending to `keys`."""
    calls = jnp.asarray(calls, jnp.float32)
    queries = jnp.asarray(queries, jnp.float32)
    keys = jnp.asarray(keys, jnp.float32)
    return Cost(
      self.dense_tokens + calls * queries,
      self.head_tokens + (calls * queries if head else 0.0),
      self.attention_pairs + calls * queries * keys,
    )


class BlockSample(NamedTuple):
  """What `BlockSampler.generate` returns.

  Attributes:
    tokens_BxL: the samples (pad after a stop).
    lengths_B: valid tokens per row (L without a stop).
    nfe: int32, network calls of the inner sampler, all blocks together.
    extensions: int32, extend_cache calls (0 with use_kv_cache=False).
    blocks: int32, blocks generated (fewer than L / N after an early stop).
    confidence_BxL: the probability each token had under the model when it
      was revealed (snapshot confidence; 1 for prompt and pad), if the inner
      sampler records it (sampling.did), else None.
    cost: per-row work, see `Cost`.
  """

  tokens_BxL: jax.Array  # noqa: N815
  lengths_B: jax.Array  # noqa: N815
  nfe: jax.Array
  extensions: jax.Array
  blocks: jax.Array
  confidence_BxL: jax.Array | None  # noqa: N815
  cost: Cost


def estimate_flops(cfg, cost: Cost, batch: int) -> float:
  """FLOPs of the work in `cost` for `batch` rows of a Transformer.

  Same terms as evaluation.cost.transformer_flops (2 FLOPs per
  multiply-add; norms, softmax and rotary left out): per dense token the
  Q/K/V/O projections, the MLP and the one-hot embedding; per head token the
  output projection; per attended pair QK^T and AV (2 * width per layer).

  Args:
    cfg: a ddlm_jax.models.TransformerConfig (width, depth, hidden_dim,
      mlp_kind, vocab_size, input_vocab_size).
  """
  from ddlm_jax.models.transformer import ONE_HOT_EMBED_MAX_VOCAB

  d, h = cfg.width, cfg.hidden_dim
  mlp = (3 if cfg.mlp_kind == 'swiglu' else 2) * d * h
  dense = cfg.depth * (4 * d * d + mlp)
  if cfg.input_vocab_size <= ONE_HOT_EMBED_MAX_VOCAB:
    dense += d * cfg.input_vocab_size
  total = (
    dense * float(cost.dense_tokens)
    + d * cfg.vocab_size * float(cost.head_tokens)
    + cfg.depth * 2 * d * float(cost.attention_pairs)
  )
  return 2.0 * total * batch


def check_block_model(model, *, use_kv_cache: bool, name: str) -> None:
  """The network must be a block-diffusion one (config block_size > 0)."""
  missing = [m for m in MODEL_METHODS if not hasattr(model, m)]
  if isinstance(model, (tuple, list)) or missing:
    raise TypeError(
      f'sampler {name!r} takes one block-diffusion network exposing '
      f'{MODEL_METHODS} (build it with TransformerConfig.block_size > 0); '
      f'got {type(model).__name__}, missing {missing or "all"}.'
    )
  if not use_kv_cache and not callable(model):
    raise TypeError(
      f'sampler {name!r} with use_kv_cache=False calls the network on '
      'concat(z, x) (the training pass); this one is not callable.'
    )


def check_block_process(process, name: str) -> None:
  """Block samplers need a block-diffusion process (BlockDiffusion, mix)."""
  if not isinstance(process, BlockProcess):
    raise TypeError(
      f'sampler {name!r} needs a block-diffusion process (BlockDiffusion or '
      f'MixScaleBlockDiffusion); got {type(process).__name__}. For a masked '
      "diffusion network use 'semi_ar' for block-wise sampling."
    )


def check_inner(sampler: Sampler, owner: str) -> Sampler:
  """An inner sampler runs masked diffusion on one block with one network."""
  if not isinstance(sampler, Sampler):
    raise TypeError(
      f'inner sampler of {owner!r} must be a sampler name or a Sampler, '
      f'got {type(sampler).__name__}.'
    )
  if sampler.num_models != 1:
    raise ValueError(
      f'inner sampler {sampler.name!r} needs {sampler.num_models} networks; '
      f'{owner!r} runs one block-diffusion network, so its inner sampler '
      "needs one network (e.g. 'ancestral' or 'first_hitting')."
    )
  families = getattr(type(sampler), 'families', ('masked',))
  if 'masked' not in tuple(families):
    raise ValueError(
      f'inner sampler {sampler.name!r} is for {tuple(families)} processes; '
      f'inside a block {owner!r} runs masked (absorbing) diffusion, so pick '
      f'a masked-family sampler: {masked_inner_names()}.'
    )
  if getattr(sampler, 'name', '') in ('block', 'did'):
    raise ValueError(f'{owner!r} cannot run {sampler.name!r} inside a block.')
  return sampler


def masked_inner_names() -> list[str]:
  """Sampler names usable inside a block: masked family, one network."""
  return sorted(
    name
    for name, cls in INNER_SAMPLERS.items()
    if 'masked' in getattr(cls, 'families', ('masked',)) and cls.num_models == 1
  )


def unigram_entropy(tokens_BxW: jax.Array) -> jax.Array:
  """Entropy in nats of each row's unigram histogram, without a V-sized one.

  With c_i the count of token i's value in the row, H = -(1/W) sum_i log(c_i
  / W): each of the c occurrences of a value contributes log(c / W) / W.
  """
  width = tokens_BxW.shape[-1]

  def row(x_W):
    s_W = jnp.sort(x_W)
    count_W = jnp.searchsorted(s_W, s_W, side='right') - jnp.searchsorted(
      s_W, s_W, side='left'
    )
    return -jnp.mean(jnp.log(count_W.astype(jnp.float32) / width))

  return jax.vmap(row)(tokens_BxW)


def _no_record(inner):
  """inner.fill as fill_recorded with the confidence left out (None)."""

  def fill(apply, key, process, z_BxN, window_BxN):
    z, nfe = inner.fill(apply, key, process, z_BxN, window_BxN)
    return z, nfe, None

  return fill


class GeneratingSampler(Sampler):
  """A sampler whose `generate` returns more than (tokens, nfe): lengths,
  cache extensions, the work done (`Cost`); calling it returns the pair."""

  def __call__(
    self,
    apply,
    key: jax.Array,
    process,
    *,
    batch: int,
    length: int,
    prompt_BxL: jax.Array | None = None,
  ):
    """(tokens_BxL, nfe) like every sampler; `generate` returns the rest."""
    out = self.generate(
      apply, key, process, batch=batch, length=length, prompt_BxL=prompt_BxL
    )
    return out.tokens_BxL, out.nfe


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockSampler(GeneratingSampler):
  """Block-by-block generation for block-diffusion networks.

  `apply` is the network itself (init_cache, block_logits, extend_cache and,
  for use_kv_cache=False, __call__ on concat(z, x)); `process` a
  BlockDiffusion (or the mix-scale process).

  Attributes:
    inner: the sampler run inside each block: a registered masked-family
      name with one network (`masked_inner_names()`) or a Sampler.
    inner_params: that sampler's parameters (dict or pairs); its
      temperature/top_k/top_p default to this sampler's.
    num_blocks: > 0 generates num_blocks * block_size tokens whatever
      `length` the caller passes (e.g. 4x the training length); 0 generates
      `length` tokens (the last block may be cut short).
    block_size: tokens per block; 0 takes the process's block_size.
    stop: 'none', 'eos', 'entropy' or 'eos+entropy' (see module doc).
    eos_id: the end-of-text id; required for stop with 'eos'.
    pad_id: written after a stop; default eos_id.
    entropy_window, entropy_threshold: the entropy rule (tokens, nats).
    use_kv_cache: cache the clean blocks (False: the 2L pass per call).
  """

  name: ClassVar[str] = 'block'
  families: ClassVar[tuple[str, ...]] = ('block',)

  inner: str | Sampler = 'ancestral'
  inner_params: tuple = ()
  num_blocks: int = 0
  block_size: int = 0
  stop: str = 'none'
  eos_id: int | None = None
  pad_id: int | None = None
  entropy_window: int = 256
  entropy_threshold: float = 4.0
  use_kv_cache: bool = True

  def __post_init__(self):
    super().__post_init__()
    params = self.inner_params
    if isinstance(params, dict) or hasattr(params, 'items'):
      params = tuple(sorted(dict(params).items()))
    self._set(inner_params=tuple(tuple(p) for p in params))
    if isinstance(self.inner, Sampler) and self.inner_params:
      raise ValueError(
        'inner_params only apply to an inner sampler given by name; '
        'set the parameters on the Sampler instance instead.'
      )
    require_int('num_blocks', self.num_blocks, 0)
    require_int('block_size', self.block_size, 0)
    if self.stop not in STOPS:
      raise ValueError(f'stop={self.stop!r}; choose one of {STOPS}.')
    if self.eos_id is not None:
      self._set(eos_id=require_int('eos_id', self.eos_id, 0))
    if self.pad_id is not None:
      self._set(pad_id=require_int('pad_id', self.pad_id, 0))
    if 'eos' in self.stop and self.eos_id is None:
      raise ValueError(
        f"stop={self.stop!r} needs eos_id, the tokenizer's end-of-text id "
        '(eos_id=tokenizer.eos_id). A tokenizer without an end token cannot '
        "stop at EOS: use stop='entropy' or 'none'."
      )
    if self.stop != 'none' and self.pad_token is None:
      raise ValueError(
        f'stop={self.stop!r} writes a pad token after a stop: pass pad_id '
        '(or eos_id).'
      )
    require_int('entropy_window', self.entropy_window, 1)
    require_float('entropy_threshold', self.entropy_threshold, 0.0, math.inf)
    self._set(use_kv_cache=bool(self.use_kv_cache))
    _ = self.inner_sampler  # Validates the inner sampler now.

  @property
  def pad_token(self) -> int | None:
    return self.eos_id if self.pad_id is None else self.pad_id

  @property
  def inner_sampler(self) -> Sampler:
    if isinstance(self.inner, Sampler):
      return check_inner(self.inner, self.name)
    if self.inner in ('block', 'did', 'semi_ar'):
      raise ValueError(
        f'{self.name!r} cannot run {self.inner!r} inside a block; pick a '
        f'masked-family sampler: {masked_inner_names()}.'
      )
    params = {**self.filters, **dict(self.inner_params)}
    return check_inner(build(LOOKUP, self.inner, **params), self.name)

  @property
  def needs_time_free(self) -> bool:
    # block_logits takes no time: the network must be time-free (BD3-LM).
    return True

  def block_length(self, process) -> int:
    size = self.block_size or int(process.block_size)
    return require_int('block_size', size, 1)

  def out_length(self, process, length: int) -> int:
    if self.num_blocks:
      return self.num_blocks * self.block_length(process)
    return int(length)

  def check_applies(self, process) -> None:
    """ValueError for another family (base), TypeError for a bad process."""
    super().check_applies(process)
    check_block_process(process, self.name)

  def _checks(self, model, process):
    self.check_applies(process)
    check_block_model(model, use_kv_cache=self.use_kv_cache, name=self.name)
    vocab = process.masked_process.vocab_size
    for field in ('eos_id', 'pad_id'):
      value = getattr(self, field)
      if value is not None and value >= vocab:
        raise ValueError(
          f'{field}={value} is not a token of the vocabulary of size {vocab}.'
        )

  def generate(
    self,
    apply,
    key: jax.Array,
    process,
    *,
    batch: int,
    length: int,
    prompt_BxL: jax.Array | None = None,
  ) -> BlockSample:
    """Draws `batch` sequences; returns a `BlockSample`.

    Args:
      apply: the block-diffusion network (see the class doc).
      length: tokens to generate (ignored when num_blocks > 0).
      prompt_BxL: optional conditioning, mask id where to generate.
    """
    self._checks(apply, process)
    total = self.out_length(process, length)
    mask_id = process.masked_process.mask_id
    if batch < 1 or total < 1:
      raise ValueError(f'batch and length must be >= 1, got {batch}, {total}.')
    if prompt_BxL is None:
      z_BxL = jnp.full((batch, total), mask_id, jnp.int32)
    else:
      if tuple(prompt_BxL.shape) != (batch, total):
        raise ValueError(
          f'prompt_BxL has shape {tuple(prompt_BxL.shape)}, expected '
          f'(batch, length) = {(batch, total)} (with num_blocks > 0 the '
          f'length is num_blocks * block_size); put the mask id {mask_id} at '
          'the positions to generate.'
        )
      z_BxL = jnp.asarray(prompt_BxL).astype(jnp.int32)
    open_BxL = jnp.ones((batch, total), bool)
    return self.run(apply, key, process, z_BxL, open_BxL)

  def fill(self, apply, key, process, z_BxL, window_BxL):
    """Fills the masked positions of z inside the window, block by block."""
    self._checks(apply, process)
    out = self.run(apply, key, process, z_BxL, window_BxL)
    return out.tokens_BxL, out.nfe

  def run(
    self, model, key, process, z_BxL, open_BxL, fill_recorded=None
  ) -> BlockSample:
    """The block loop on an initial state; open_BxL marks what may change.

    `fill_recorded(apply, key, process, z_BxN, window_BxN) -> (z, nfe,
    confidence_BxN)` replaces the inner sampler (DiD's recording samplers);
    by default the inner sampler's fill, recording nothing.
    """
    records = fill_recorded is not None
    if fill_recorded is None:
      inner = self.inner_sampler
      fill_recorded = getattr(inner, 'fill_recorded', None)
      records = fill_recorded is not None
      fill_recorded = fill_recorded or _no_record(inner)
    masked_process = process.masked_process
    mask_id = masked_process.mask_id
    size = self.block_length(process)
    batch, total = z_BxL.shape
    blocks = -(-total // size)
    padded = blocks * size
    stop_eos = 'eos' in self.stop
    stop_entropy = 'entropy' in self.stop
    if stop_entropy and self.entropy_window > total:
      raise ValueError(
        f'entropy_window={self.entropy_window} is longer than the {total} '
        'tokens generated, so the entropy rule could never stop a row; '
        'lower it or use a longer length.'
      )
    pad = self.pad_token
    eos = self.eos_id
    width = self.entropy_window

    # Positions past `total` (a cut last block) stay masked, never open.
    extra = padded - total
    z = jnp.pad(
      z_BxL.astype(jnp.int32), ((0, 0), (0, extra)), constant_values=mask_id
    )
    opened = jnp.pad(open_BxL & (z_BxL == mask_id), ((0, 0), (0, extra)))
    offs_N = jnp.arange(size)
    cache = model.init_cache(batch, padded) if self.use_kv_cache else None

    conf = jnp.ones((batch, padded), jnp.float32) if records else None

    def cond(carry):
      b, stopped = carry[0], carry[4]
      return (b < blocks) & ~jnp.all(stopped)

    def body(carry):
      b, z, conf, cache, stopped, lengths, nfe, ext, cost = carry
      start = b * size
      z_blk = jax.lax.dynamic_slice_in_dim(z, start, size, axis=1)
      open_blk = jax.lax.dynamic_slice_in_dim(opened, start, size, axis=1)
      window = open_blk & (z_blk == mask_id) & ~stopped[:, None]

      if self.use_kv_cache:
        apply = lambda zz, t: model.block_logits(zz, cache, start)
        per_call = (size, start + size, True)
      else:

        def apply(zz, t):
          noisy = jax.lax.dynamic_update_slice_in_dim(z, zz, start, axis=1)
          logits = model(
            jnp.concatenate([noisy, z], axis=1), t, block_size=size
          )
          return jax.lax.dynamic_slice_in_dim(logits, start, size, axis=1)

        per_call = (2 * padded, 2 * padded, True)

      block_key = jax.random.fold_in(key, b)

      def run_inner():
        zz, n, c = fill_recorded(
          apply, block_key, masked_process, z_blk, window
        )
        c = jnp.zeros(z_blk.shape, jnp.float32) if c is None else c
        return zz.astype(jnp.int32), jnp.asarray(n, jnp.int32), c

      def skip():
        return z_blk, jnp.int32(0), jnp.zeros(z_blk.shape, jnp.float32)

      z_new, n, c_blk = jax.lax.cond(jnp.any(window), run_inner, skip)
      nfe = nfe + n
      cost = cost.add(n, *per_call)

      hit = jnp.zeros((batch,), bool)
      after = jnp.zeros(z_blk.shape, bool)
      if stop_eos:
        is_eos = (z_new == eos) & window
        hit = jnp.any(is_eos, axis=-1)
        first = jnp.argmax(is_eos, axis=-1)
        after = hit[:, None] & (offs_N[None] > first[:, None]) & open_blk
        z_new = jnp.where(after, pad, z_new)
        lengths = jnp.where(hit & ~stopped, start + first + 1, lengths)
      # Rows stopped before this block get pad where they were masked.
      if pad is not None:
        z_new = jnp.where(
          stopped[:, None] & open_blk & (z_new == mask_id), pad, z_new
        )
      z = jax.lax.dynamic_update_slice_in_dim(z, z_new, start, axis=1)
      if records:
        old = jax.lax.dynamic_slice_in_dim(conf, start, size, axis=1)
        new = jnp.where(window & ~after, c_blk, old)
        conf = jax.lax.dynamic_update_slice_in_dim(conf, new, start, axis=1)
      if stop_entropy:
        end = jnp.minimum(start + size, total)
        recent = jax.lax.dynamic_slice_in_dim(
          z, jnp.maximum(end - width, 0), width, axis=1
        )
        low = (unigram_entropy(recent) < self.entropy_threshold) & (
          end >= width
        )
        low = low & ~stopped & ~hit
        lengths = jnp.where(low, end, lengths)
        hit = hit | low
      stopped = stopped | hit

      more = (b + 1 < blocks) & ~jnp.all(stopped)
      if self.use_kv_cache:
        cache = jax.lax.cond(
          more,
          lambda: model.extend_cache(z_new, cache, start),
          lambda: cache,
        )
        ext = ext + more.astype(jnp.int32)
        cost = cost.add(more, size, start + size, head=False)
      return b + 1, z, conf, cache, stopped, lengths, nfe, ext, cost

    init = (
      jnp.int32(0),
      z,
      conf,
      cache,
      jnp.zeros((batch,), bool),
      jnp.full((batch,), total, jnp.int32),
      jnp.int32(0),
      jnp.int32(0),
      Cost.zero(),
    )
    b, z, conf, _, stopped, lengths, nfe, ext, cost = jax.lax.while_loop(
      cond, body, init
    )
    if pad is not None:  # Blocks never visited after everyone stopped.
      z = jnp.where(stopped[:, None] & opened & (z == mask_id), pad, z)
    return BlockSample(
      tokens_BxL=z[:, :total],
      lengths_B=lengths,
      nfe=nfe,
      extensions=ext,
      blocks=b,
      confidence_BxL=None if conf is None else conf[:, :total],
      cost=cost,
    )
