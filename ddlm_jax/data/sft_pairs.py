"""Prompt -> response pairs for supervised fine-tuning, from the suite's tasks.

`data.corpus = 'sft_arithmetic'`: the multi-step modular arithmetic of
`data.reasoning` as an instruction set. A prompt asks for a problem's
value, the response writes the running results and the answer:

  prompt    'Compute mod 10: 3+4*2='
  response  '7;4;'                    (left to right: 3+4=7, 7*2=14 -> 4)

Each row is the prompt's ids, the response's ids, then the tokenizer's EOS
(or, for tokenizers without one, its id of '\n') repeated to `seq_len`;
`loss_mask` is 0 on the prompt and 1 on the response and the EOS fill,
which is the response mask `process.kind = 'mdlm_sft'` reads (the model
learns to stop, as LLaDA's SFT pads with EOS). Pairs are drawn from a
numpy Generator seeded by the split's name, so every process and every
restart sees the same set; `data.sft_pairs` sets its size per split and
`data.sft_levels` the levels.

The tokenizer is the run's: a fine-tuning run (`train.init_from`) reads
the one it copied from the imported model; a run from scratch fits a
character tokenizer to the pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ddlm_jax.data import pipeline, reasoning
from ddlm_jax.data import tokenizers as tok_lib
from ddlm_jax.data.sources import Source
from ddlm_jax.errors import ConfigError

PROMPT = 'Compute mod 10: {question}='
SPLIT_SEEDS = {'train': 0, 'validation': 1, 'test': 2}
DEFAULT_PAIRS = {'train': 4096, 'validation': 256, 'test': 256}


def arithmetic_pairs(
  num: int, levels: Sequence[int], seed: int
) -> list[tuple[str, str]]:
  """`num` (prompt, response) strings, levels drawn uniformly."""
  rng = np.random.default_rng(seed)
  drawn = rng.choice(np.asarray(levels), size=num)
  pairs = []
  for level in drawn:
    level = int(level)
    p = reasoning.generate(1, level, rng, reasoning.plan_tokens_needed(level))
    question = reasoning.decode(p['question'][0])
    plan = reasoning.decode(p['plan'][0])
    pairs.append((PROMPT.format(question=question), plan))
  return pairs


def end_id(tokenizer) -> int:
  """The id that ends a response and fills the row: EOS, else '\\n'."""
  specials = getattr(tokenizer, 'special_ids', None)
  if specials is not None and specials.eos is not None:
    return int(specials.eos)
  ids = np.asarray(tokenizer.encode('\n')).reshape(-1)
  if len(ids) != 1:
    raise ConfigError(
      'the tokenizer has no EOS and no single id for a newline; SFT rows '
      'need one to end responses (use a tokenizer with an EOS token).'
    )
  return int(ids[0])


def encode_pairs(pairs, tokenizer, seq_len: int) -> dict[str, np.ndarray]:
  """{'tokens': int32 [B, L], 'loss_mask': f32 [B, L] (1 = response)}."""
  fill = end_id(tokenizer)
  tokens_BxL = np.full((len(pairs), seq_len), fill, np.int32)
  mask_BxL = np.ones((len(pairs), seq_len), np.float32)
  for b, (prompt, response) in enumerate(pairs):
    p = np.asarray(tokenizer.encode(prompt), np.int32).reshape(-1)
    r = np.asarray(tokenizer.encode(response), np.int32).reshape(-1)
    if len(p) + len(r) + 1 > seq_len:
      raise ConfigError(
        f'an SFT pair needs {len(p) + len(r) + 1} tokens (prompt, response, '
        f'EOS), more than data.seq_len={seq_len}; raise data.seq_len.'
      )
    tokens_BxL[b, : len(p)] = p
    tokens_BxL[b, len(p) : len(p) + len(r)] = r
    mask_BxL[b, : len(p)] = 0.0
  return {'tokens': tokens_BxL, 'loss_mask': mask_BxL}


class _EncodePairs:
  """Pair indices -> a batch (a grain map function)."""

  def __init__(self, pairs, tokenizer, seq_len: int):
    self._pairs, self._tokenizer, self._seq_len = pairs, tokenizer, seq_len

  def __call__(self, ids_B: np.ndarray) -> dict[str, np.ndarray]:
    batch = [self._pairs[int(i)] for i in np.asarray(ids_B)]
    return encode_pairs(batch, self._tokenizer, self._seq_len)


class PairSource(Source):
  """A Source whose splits are lists of (prompt, response) pairs."""

  def is_padded(self, split: str = 'train') -> bool:
    return True

  def train_dataset(
    self,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    shard_index: int = 0,
    shard_count: int = 1,
  ):
    pairs = self.split('train')
    ds, _ = pipeline.epoch_batches(
      len(pairs),
      batch_size=batch_size,
      seed=seed,
      shard_index=shard_index,
      shard_count=shard_count,
      what=f'The train split has {len(pairs)} pairs',
    )
    return ds.map(_EncodePairs(pairs, self.tokenizer, seq_len))

  def eval_batches(
    self,
    split: str,
    *,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
    drop_partial: bool = True,
  ) -> list[dict[str, np.ndarray]]:
    pairs = self.split(split)
    groups = pipeline.eval_groups(
      len(pairs), batch_size, max_batches, drop_partial, f'The {split} split'
    )
    encode = _EncodePairs(pairs, self.tokenizer, seq_len)
    return [encode(np.asarray(g)) for g in groups]

  def split_tokens(self, split: str) -> np.ndarray:
    raise ValueError(
      f'{self.name} split {split!r} holds prompt/response pairs, one per '
      'row; use data.eval_batches(...) instead.'
    )


def arithmetic_source(cfg, tokenizer: tok_lib.Tokenizer | None = None):
  """The 'sft_arithmetic' Source of a config's `data` block."""
  levels = tuple(cfg.sft_levels)
  bad = [lv for lv in levels if lv not in reasoning.LEVELS]
  if not levels or bad:
    raise ConfigError(
      f'data.sft_levels={levels}: give levels among {reasoning.LEVELS}.'
    )
  sizes = {**DEFAULT_PAIRS, **dict(cfg.sft_pairs or {})}

  def factory(name):
    return lambda: arithmetic_pairs(sizes[name], levels, SPLIT_SEEDS[name])

  if tokenizer is None:
    sample = arithmetic_pairs(64, reasoning.LEVELS, seed=99)
    alphabet = PROMPT + ''.join(reasoning.VOCAB[:-1]) + '\n'
    text = alphabet + ''.join(p + r for p, r in sample)
    tokenizer = tok_lib.build_tokenizer('char', text)
  return PairSource(
    'sft_arithmetic',
    tokenizer,
    {name: factory(name) for name in SPLIT_SEEDS},
    notes='prompt -> response pairs of modular arithmetic (levels '
    f'{levels}); loss_mask marks the response.',
  )
