"""Sample-quality metrics: generative perplexity, entropy, repetition, MAUVE.

Generative perplexity scores samples with an autoregressive model trained by
this suite on the same corpus (the AR twin; `ARScorer.from_run`). Both
aggregates are reported and labelled, because papers differ:
`gen_ppl_corpus` = exp(total NLL / total tokens) (as MDLM reports it) and
`gen_ppl_sample_mean` = mean over samples of exp(NLL_i / tokens_i). Samples
longer than the scorer's context are scored in consecutive windows, each
restarted from BOS, exactly as the AR twin's evaluation cuts the text.

Low gen-ppl with low unigram entropy signals repetitive text, so entropy
(per sample, nats and bits) and the repeated n-gram rate are always reported
beside it. MAUVE uses the `mauve-text` package on mean-pooled hidden states
of the same AR model (Transformer.backbone).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.diffusion.masked import token_cross_entropy


def unigram_entropy(tokens) -> float:
  """Entropy (nats) of the empirical token distribution of one sample."""
  tokens = np.asarray(tokens).reshape(-1)
  if tokens.size == 0:
    return 0.0
  counts = np.unique(tokens, return_counts=True)[1].astype(np.float64)
  p = counts / counts.sum()
  return float(-np.sum(p * np.log(p)) + 0.0)


def repetition_rate(tokens, n: int) -> float:
  """Fraction of a sample's n-grams that repeat an earlier one.

  1 - (distinct n-grams) / (n-grams); 0 without repeats, -> 1 for loops.
  """
  if n < 1:
    raise ValueError(f'n must be >= 1, got {n}.')
  tokens = [int(x) for x in np.asarray(tokens).reshape(-1)]
  grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
  if not grams:
    return 0.0
  return 1.0 - len(Counter(grams)) / len(grams)


def content_metrics(rows: Sequence, ngrams=(2, 3, 4)) -> dict:
  """Per-sample unigram entropy and repetition rates, with their means."""
  ent = [unigram_entropy(r) for r in rows]
  out = {
    'unigram_entropy_nats': float(np.mean(ent)) if ent else 0.0,
    'unigram_entropy_bits': float(np.mean(ent)) / math.log(2) if ent else 0.0,
    'unigram_entropy_nats_per_sample': ent,
  }
  for n in ngrams:
    rep = [repetition_rate(r, n) for r in rows]
    out[f'repetition_rate_{n}gram'] = float(np.mean(rep)) if rep else 0.0
    out[f'repetition_rate_{n}gram_per_sample'] = rep
  return out


def perplexity_summary(nll_N, count_N) -> dict:
  """Corpus-level and per-sample-mean perplexities from summed NLLs."""
  nll = np.asarray(nll_N, np.float64)
  count = np.asarray(count_N, np.float64)
  if nll.size == 0 or np.any(count <= 0):
    raise ValueError('every scored sample needs at least one token.')
  per_sample = np.exp(nll / count)
  return {
    'gen_ppl_corpus': float(math.exp(nll.sum() / count.sum())),
    'gen_ppl_sample_mean': float(per_sample.mean()),
    'gen_nats_per_token': float(nll.sum() / count.sum()),
    'gen_ppl_per_sample': per_sample.tolist(),
    'gen_ppl_num_tokens': int(count.sum()),
  }


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _model_logits(params, inp_BxL, *, graphdef):
  model = nnx.merge(graphdef, params)
  return model(inp_BxL, jnp.zeros((inp_BxL.shape[0],), jnp.float32))


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _model_hidden(params, inp_BxL, *, graphdef):
  model = nnx.merge(graphdef, params)
  t_B = jnp.zeros((inp_BxL.shape[0],), jnp.float32)
  return model.backbone(model.embed(inp_BxL), t_B)


@jax.jit
def _position_nll(logits_BxLxV, x_BxL):
  return token_cross_entropy(logits_BxLxV, x_BxL)


class ARScorer:
  """Scores token sequences with a causal LM (inputs: BOS + shifted tokens).

  Args:
    logits_fn: inp_BxL -> logits_BxLxV of a causal network.
    bos_id: the BOS id the network was trained with (= its vocab size).
    max_length: context length; longer samples are scored in windows.
    hidden_fn: inp_BxL -> hidden states [B, L, D] (for MAUVE features).
    tokenizer: the scorer's tokenizer, for `score_texts`.
    batch_size: windows per call (the last batch is padded).
  """

  def __init__(
    self,
    logits_fn: Callable,
    *,
    bos_id: int,
    max_length: int,
    hidden_fn: Callable | None = None,
    tokenizer=None,
    batch_size: int = 16,
  ):
    if max_length < 1:
      raise ValueError(f'max_length must be >= 1, got {max_length}.')
    self.logits_fn = logits_fn
    self.hidden_fn = hidden_fn
    self.bos_id = bos_id
    self.max_length = max_length
    self.tokenizer = tokenizer
    self.batch_size = batch_size

  @classmethod
  def from_params(cls, graphdef, params, process, **kwargs) -> ARScorer:
    if not process.causal:
      raise ValueError(
        'the scorer must be an autoregressive run (process.kind=ar); got '
        f'{type(process).__name__}.'
      )
    return cls(
      functools.partial(_model_logits, params, graphdef=graphdef),
      hidden_fn=functools.partial(_model_hidden, params, graphdef=graphdef),
      bos_id=process.bos_id,
      **kwargs,
    )

  @classmethod
  def from_run(cls, run, batch_size: int = 16) -> ARScorer:
    """The scorer of a restored AR run (tasks.language_model.load_run)."""
    return cls.from_params(
      run.graphdef,
      run.eval_params(),
      run.process,
      max_length=run.settings.data.seq_len,
      tokenizer=run.data.tokenizer,
      batch_size=batch_size,
    )

  def _windows(self, rows):
    """(sample index, window tokens) for every context-sized window."""
    out = []
    for i, row in enumerate(rows):
      row = np.asarray(row, np.int32).reshape(-1)
      for start in range(0, row.size, self.max_length):
        out.append((i, row[start : start + self.max_length]))
    return out

  def _batches(self, windows, width: int):
    """Padded [batch, width] arrays of windows (padding weight 0)."""
    for lo in range(0, len(windows), self.batch_size):
      chunk = windows[lo : lo + self.batch_size]
      x = np.zeros((self.batch_size, width), np.int32)
      w = np.zeros((self.batch_size, width), np.float32)
      for j, (_, toks) in enumerate(chunk):
        x[j, : toks.size] = toks
        w[j, : toks.size] = 1.0
      yield chunk, x, w

  def _width(self, windows) -> int:
    longest = max(t.size for _, t in windows)
    return min(self.max_length, -(-longest // 32) * 32)

  def token_nll(self, rows: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Summed NLL (nats) and token count of each sample."""
    windows = self._windows(rows)
    nll = np.zeros(len(rows))
    count = np.zeros(len(rows))
    if not windows:
      return nll, count
    width = self._width(windows)
    for chunk, x, w in self._batches(windows, width):
      bos = np.full((x.shape[0], 1), self.bos_id, np.int32)
      inp = np.concatenate([bos, x[:, :-1]], axis=1)
      logits = self.logits_fn(jnp.asarray(inp))
      per_pos = np.asarray(_position_nll(logits, jnp.asarray(x))) * w
      for j, (i, _) in enumerate(chunk):
        nll[i] += per_pos[j].sum()
        count[i] += w[j].sum()
    return nll, count

  def gen_ppl(self, rows: Sequence) -> dict:
    """perplexity_summary of the samples (lists of scorer-token ids)."""
    return perplexity_summary(*self.token_nll(rows))

  def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
    if self.tokenizer is None:
      raise ValueError('this scorer has no tokenizer; score token ids.')
    return [self.tokenizer.encode(t) for t in texts]

  def features(self, rows: Sequence) -> np.ndarray:
    """Mean-pooled hidden states [N, D] of each sample's first window."""
    if self.hidden_fn is None:
      raise ValueError('this scorer has no hidden_fn; build it from params.')
    # BOS + up to max_length - 1 tokens; pool over the positions after BOS.
    windows = [
      (i, np.asarray(r, np.int32).reshape(-1)[: self.max_length - 1])
      for i, r in enumerate(rows)
    ]
    width = min(self.max_length, max(t.size for _, t in windows) + 1)
    feats = [None] * len(rows)
    for chunk, x, w in self._batches(windows, width - 1):
      bos = np.full((x.shape[0], 1), self.bos_id, np.int32)
      h = np.asarray(self.hidden_fn(jnp.asarray(np.concatenate([bos, x], 1))))
      h = h[:, 1:].astype(np.float64)
      pooled = (h * w[..., None]).sum(1) / np.maximum(w.sum(1), 1.0)[:, None]
      for j, (i, _) in enumerate(chunk):
        feats[i] = pooled[j]
    return np.stack(feats)


def mauve_score(p_features, q_features, *, seed: int = 25, **kwargs) -> float:
  """MAUVE(p = reference text, q = samples) from precomputed features."""
  try:
    import mauve
  except ImportError as err:
    raise ImportError(
      'MAUVE needs the mauve-text package: pip install mauve-text'
    ) from err
  p = np.asarray(p_features, np.float32)
  q = np.asarray(q_features, np.float32)
  kwargs.setdefault('num_buckets', max(2, min(len(p), len(q)) // 10))
  out = mauve.compute_mauve(
    p_features=p, q_features=q, seed=seed, verbose=False, **kwargs
  )
  return float(out.mauve)


def throughput(num_samples: int, length: int, seconds: float, nfe) -> dict:
  """Wall-clock rates of one sampling call, and NFE per sample."""
  seconds = max(float(seconds), 1e-9)
  nfe_total = float(np.sum(np.asarray(nfe)))
  return {
    'sample_seconds': float(seconds),
    'samples_per_sec': num_samples / seconds,
    'tokens_per_sec': num_samples * length / seconds,
    'seconds_per_sample': seconds / num_samples,
    'nfe': int(nfe_total),
  }


def sample_quality(
  texts: Sequence[str],
  tokens=None,
  *,
  scorer: ARScorer | None = None,
  same_tokenizer: bool = False,
  reference_texts: Sequence[str] | None = None,
  mauve: bool = False,
  ngrams=(2, 3, 4),
) -> dict:
  """Content metrics, and with a scorer gen-ppl (and MAUVE) of samples.

  Args:
    texts: decoded samples.
    tokens: the sampler's token rows (entropy/repetition are computed on
      them; on the scorer's encoding of `texts` when None).
    same_tokenizer: the scorer shares the sampler's tokenizer, so `tokens`
      are scored directly instead of re-encoding the texts.
    reference_texts: real text for MAUVE (p); needed when mauve=True.
  """
  rows = None
  if scorer is not None:
    if same_tokenizer and tokens is not None:
      rows = [np.asarray(r) for r in tokens]
    else:
      rows = scorer.encode(texts)
  content_rows = tokens if tokens is not None else rows
  if content_rows is None:
    raise ValueError('pass the sampler tokens or a scorer with a tokenizer.')
  out = content_metrics(list(content_rows), ngrams)
  if scorer is None:
    return out
  out.update(scorer.gen_ppl(rows))
  if mauve:
    if not reference_texts:
      raise ValueError('mauve=True needs reference_texts (real text).')
    p = scorer.features(scorer.encode(reference_texts))
    q = scorer.features(rows)
    out['mauve'] = mauve_score(p, q)
    out['mauve_num_reference'] = len(reference_texts)
  return out
