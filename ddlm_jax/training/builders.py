"""Builds the process, model and data of a run from its ConfigDict."""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from flax import nnx

from ddlm_jax.data import corpus, pipeline, tokenizers
from ddlm_jax.diffusion import Autoregressive, MaskedDiffusion, get_schedule
from ddlm_jax.models import Transformer, TransformerConfig

PROCESSES = ('mdlm', 'md4', 'ar')


def build_process(cfg, vocab_size: int):
  """Masked diffusion ('mdlm' / 'md4') or the AR twin ('ar')."""
  kind = cfg.kind
  if kind not in PROCESSES:
    raise ValueError(
      f'config.process.kind={kind!r}; choose one of {PROCESSES}.'
    )
  if kind == 'ar':
    return Autoregressive(vocab_size=vocab_size)
  schedule = get_schedule(cfg.schedule, **dict(cfg.schedule_kwargs))
  return MaskedDiffusion(
    schedule=schedule,
    vocab_size=vocab_size,
    num_steps=cfg.num_steps,
    t_min=cfg.t_min,
    antithetic=cfg.antithetic,
    loss_type=cfg.loss_type,
  )


def model_config(cfg, process) -> TransformerConfig:
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  kwargs = {k: v for k, v in cfg.to_dict().items() if k in fields}
  unknown = set(cfg.to_dict()) - fields
  if unknown:
    raise ValueError(
      f'config.model has keys the transformer does not take: '
      f'{sorted(unknown)}; it takes {sorted(fields)}.'
    )
  kwargs.update(
    vocab_size=process.vocab_size,
    input_vocab_size=process.input_vocab_size,
    causal=process.causal,
  )
  return TransformerConfig(**kwargs)


def model_builder(cfg, process):
  """build(rngs) -> Transformer, as init_train_state expects."""
  mcfg = model_config(cfg, process)
  return lambda rngs: Transformer(mcfg, rngs=rngs)


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


@dataclasses.dataclass
class Data:
  tokenizer: tokenizers.Tokenizer
  splits: dict[str, np.ndarray]  # token ids per split


def prepare_data(cfg, workdir: str | None) -> Data:
  """Loads the corpus, fits or reloads the tokenizer, encodes the splits.

  A tokenizer saved in workdir/tokenizer (from an earlier start of the same
  run) is reused, so a resumed run keeps its vocabulary.
  """
  kwargs = {}
  if cfg.corpus == 'text_files':
    kwargs = {k: v for k, v in cfg.files.to_dict().items() if v}
  texts = corpus.load_text_splits(cfg.corpus, **kwargs)
  tok_dir = os.path.join(workdir, 'tokenizer') if workdir else None
  if tok_dir and os.path.exists(
    os.path.join(tok_dir, tokenizers.TOKENIZER_FILENAME)
  ):
    tok = tokenizers.load_tokenizer(tok_dir)
  else:
    tok_kwargs = {}
    if cfg.tokenizer == 'bpe':
      tok_kwargs['vocab_size'] = cfg.bpe_vocab_size
    tok = tokenizers.build_tokenizer(
      cfg.tokenizer, texts['train'], **tok_kwargs
    )
    if tok_dir:
      tok.save(tok_dir)
  splits = {name: tok.encode(text) for name, text in texts.items() if text}
  return Data(tokenizer=tok, splits=splits)


def train_batches(cfg, data: Data, seed: int):
  """The checkpointable training iterator for this process."""
  count = jax.process_count()
  if cfg.batch_size % count:
    raise ValueError(
      f'data.batch_size={cfg.batch_size} must divide across {count} processes.'
    )
  return pipeline.train_iterator(
    data.splits['train'],
    seq_len=cfg.seq_len,
    batch_size=cfg.batch_size // count,
    seed=seed,
    shard_index=jax.process_index(),
    shard_count=count,
  )


def abstract_model(cfg, process):
  return nnx.eval_shape(lambda: model_builder(cfg, process)(nnx.Rngs(0)))
