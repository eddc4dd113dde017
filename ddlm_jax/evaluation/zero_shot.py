"""Zero-shot likelihood: a trained run's NELBO on corpora it never saw.

The MDLM/SEDD recipe (MDLM Table 3): take each set's documents
(``ddlm_jax.data.zero_shot``: split, text column, detokenizer), tokenize
them with the run's tokenizer (GPT-2 for OpenWebText models), follow each
document with EOS, join them and cut rows of the run's ``seq_len`` framed
the way the run was trained (the data settings' ``wrap``: ``[BOS] ... [EOS]``
for MDLM, none for md4). Every row is scored with the run's bound (NELBO for
diffusion, exact NLL for AR) and the set's score is total nats over total
tokens, reported as nats/token, bits/token and the perplexity bound
``exp(nats/token)``. All full rows are scored (the last, partial batch is
padded with copies that are then dropped); the tail shorter than one row is
dropped.

``ddlm_jax.tasks.language_model.evaluate_zero_shot(workdir, names)`` restores a
run (its ``config.json`` and newest checkpoint; the tokenizer comes from
``workdir/tokenizer`` so the training data need not be present), scores it
with ``evaluate_dataset`` and writes ``workdir/zero_shot.json``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import jax
import numpy as np

from ddlm_jax.data import sources
from ddlm_jax.data import zero_shot as zs_data
from ddlm_jax.data.tokenizers import BPETokenizer
from ddlm_jax.evaluation.likelihood import (
  config_estimator,
  row_nll,
  summarize_nll,
)


def packed_rows(
  docs: Sequence[str],
  tokenizer,
  *,
  seq_len: int,
  wrap: str,
) -> sources.PackedSplit:
  """The documents as one EOS-separated stream, framed rows of ``seq_len``."""
  if not isinstance(tokenizer, BPETokenizer):
    raise ValueError(
      f'Zero-shot evaluation needs a subword tokenizer with BOS/EOS (a run '
      f'trained on openwebtext or lm1b); this run has {tokenizer!r}.'
    )
  specials = tokenizer.special_ids
  bos, eos = sources.framing_ids(wrap, specials, 'run')
  pieces = list(sources.document_stream(docs, tokenizer, specials.eos))
  stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
  return sources.PackedSplit(stream.astype(np.int32), bos=bos, eos=eos)


def score_rows(
  run,
  rows: sources.PackedSplit,
  *,
  batch_size: int,
  max_batches: int | None,
  time_samples: int,
  seed: int,
  estimator: str | None = None,
) -> np.ndarray:
  """Per-row NELBO (nats) of every full row: float64 [num_rows].

  `estimator` (default: the run's `eval.estimator`, 'iid' when unset)
  draws the `time_samples` samples as `evaluation.estimators` describes.
  """
  if estimator is None:
    estimator = config_estimator(run.config, run.process)
  seq_len = run.settings.data.seq_len
  batches = sources.packed_eval_batches(
    rows,
    seq_len=seq_len,
    batch_size=batch_size,
    max_batches=max_batches,
    drop_partial=False,
    split_name='zero-shot',
  )
  samples = 1 if run.process.causal else time_samples
  params = run.eval_params()
  key = jax.random.key(seed)
  out = []
  for i, batch in enumerate(batches):
    x_BxL = batch['tokens']
    n = x_BxL.shape[0]
    if n < batch_size:  # One compiled shape: pad with copies, drop them.
      x_BxL = np.concatenate([x_BxL, np.repeat(x_BxL[:1], batch_size - n, 0)])
    nll_B = row_nll(  # numpy input: replicated on every process.
      params,
      jax.random.fold_in(key, i),
      np.asarray(x_BxL, np.int32),
      graphdef=run.graphdef,
      process=run.process,
      samples=samples,
      estimator=estimator,
    )
    out.append(np.asarray(nll_B, np.float64)[:n])
  return np.concatenate(out)


def evaluate_dataset(
  run,
  name: str,
  *,
  data_dir: str = '',
  tfds_data_dir: str = '',
  split: str = '',
  batch_size: int = 0,
  max_batches: int = 0,
  max_documents: int = 0,
  time_samples: int = 0,
  seed: int = 0,
) -> dict:
  """Zero-shot NELBO of a restored ``run`` on the set ``name``.

  Args:
    run: a ``ddlm_jax.tasks.language_model.Run`` with its checkpoint restored.
    name: a key of ``ddlm_jax.data.zero_shot.ZERO_SHOT_DATASETS``.
    data_dir, tfds_data_dir, split: see ``load_zero_shot``.
    batch_size: rows per batch (0: ``config.eval.batch_size``).
    max_batches: score at most this many batches (0: all rows).
    max_documents: use only the first documents (0: all); for quick checks.
    time_samples: Monte-Carlo draws of t per row (0:
      ``config.eval.final_time_samples``); ignored for AR.
    seed: evaluation randomness.

  Returns:
    ``summarize_nll``'s fields plus dataset, split, documents and timing.
  """
  cfg, data = run.config, run.settings.data
  t0 = time.perf_counter()
  spec = zs_data.get_dataset(name)
  docs = zs_data.load_zero_shot(
    name, data_dir=data_dir, tfds_data_dir=tfds_data_dir, split=split
  )
  if max_documents:
    docs = docs.get_many(range(min(len(docs), max_documents)))
  wrap = data.wrap
  rows = packed_rows(docs, run.data.tokenizer, seq_len=data.seq_len, wrap=wrap)
  if rows.num_windows(data.seq_len) == 0:
    raise ValueError(
      f'{name}: {len(docs)} documents make {rows.tokens.size} tokens, fewer '
      f'than one row of seq_len {data.seq_len}.'
    )
  nll = score_rows(
    run,
    rows,
    batch_size=batch_size or cfg.eval.batch_size,
    max_batches=max_batches or None,
    time_samples=time_samples or cfg.eval.final_time_samples,
    seed=seed,
  )
  result = summarize_nll(nll, data.seq_len)
  result.update(
    dataset=name,
    split=split or spec.split,
    detokenizer=spec.detokenizer or 'none',
    wrap=wrap,
    num_documents=len(docs),
    seconds=time.perf_counter() - t0,
  )
  return result


def format_table(results: dict[str, dict]) -> str:
  """A plain-text table: dataset, split, tokens, nats/token, ppl bound."""
  lines = [
    f'{"dataset":<12} {"split":<10} {"tokens":>10} {"nats/tok":>9} '
    f'{"ppl <=":>10}'
  ]
  for name, r in results.items():
    ppl = r['perplexity_bound']
    shown = f'{ppl:10.2f}' if math.isfinite(ppl) else f'{"inf":>10}'
    lines.append(
      f'{name:<12} {r["split"]:<10} {r["num_tokens"]:>10} '
      f'{r["nats_per_token"]:9.4f} {shown}'
    )
  return '\n'.join(lines)


__all__ = [
  'evaluate_dataset',
  'format_table',
  'packed_rows',
  'score_rows',
]
