"""Validation likelihood: NELBO (diffusion) or exact NLL (AR), with errors.

Each sequence's bound is averaged over `time_samples` Monte-Carlo draws of
(t, z_t); the reported standard error is over sequences (it contains both the
data spread and the remaining Monte-Carlo noise, so it is honest about both).
Units: nats/token, bits/token (= BPC on characters) and the perplexity bound
exp(nats/token). `evaluate_likelihood(..., estimator=...)` draws the samples
with one of the lower-variance estimators of `evaluation.estimators`
(masked diffusion only; others keep i.i.d. draws).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.diffusion.base import Process
from ddlm_jax.evaluation import estimators as est


@functools.partial(jax.jit, static_argnames=('graphdef', 'process', 'samples'))
def sequence_nll(
  params, key, x_BxL, mask_BxL=None, *, graphdef, process, samples: int
):
  """Per-sequence NELBO (nats), averaged over `samples` draws: [B]."""
  apply = nnx.merge(graphdef, params)

  def one(key):
    return process.loss(apply, key, x_BxL, mask_BxL)[1]

  return jnp.mean(jax.lax.map(one, jax.random.split(key, samples)), axis=0)


def summarize_nll(nll_per_seq, tokens_per_seq) -> dict[str, float]:
  """Mean and standard error in nats/token, bits/token and perplexity.

  nats/token is total NLL over total tokens; with equal-length sequences its
  standard error is the usual one of per-sequence means, and with padding
  the delta-method error of that ratio.
  """
  nll = np.asarray(nll_per_seq, np.float64)
  tokens = np.broadcast_to(np.asarray(tokens_per_seq, np.float64), nll.shape)
  n = nll.size
  mean = float(nll.sum() / tokens.sum())
  resid = nll - mean * tokens
  stderr = (
    float(np.sqrt(np.sum(resid**2) / (n * (n - 1))) / tokens.mean())
    if n > 1
    else 0.0
  )
  ln2 = math.log(2.0)
  return {
    'nats_per_token': mean,
    'nats_per_token_stderr': stderr,
    'bits_per_token': mean / ln2,
    'bits_per_token_stderr': stderr / ln2,
    'perplexity_bound': math.exp(mean),
    'num_sequences': n,
    'num_tokens': int(tokens.sum()),
  }


def evaluate_likelihood(
  params,
  graphdef,
  process: Process,
  batches: Iterable[np.ndarray],
  *,
  key: jax.Array,
  time_samples: int = 1,
  estimator: str = 'iid',
) -> dict[str, float]:
  """NELBO/NLL over `batches`: int32 [B, L] arrays, or dicts with 'tokens'
  and an optional float 'loss_mask' [B, L] (1 = real token).

  `estimator` (one of `estimators.ESTIMATORS`) sets how the `time_samples`
  draws of a masked-diffusion bound are taken ('counts' needs a time-free
  network); other processes always draw i.i.d.
  """
  # Soft-masking evaluates its two-pass path, whatever it trains with.
  process = process.evaluation_process
  samples = 1 if process.causal else time_samples
  steered = estimator != 'iid' and est.supports_estimators(process)
  if steered:
    est.check_estimator(estimator, samples)
  per_seq, counts = [], []
  for i, batch in enumerate(batches):
    if not isinstance(batch, dict):
      batch = {'tokens': batch}
    x_BxL = jnp.asarray(batch['tokens'])
    mask = batch.get('loss_mask')
    if steered:
      if mask is None:
        mask = np.ones(x_BxL.shape, np.float32)
      nll_B = est.bound_draws(
        params,
        jax.random.fold_in(key, i),
        x_BxL,
        jnp.asarray(mask, jnp.float32),
        graphdef=graphdef,
        process=process,
        samples=samples,
        estimator=estimator,
      ).mean(0)
      per_seq.append(np.asarray(nll_B))
      counts.append(np.asarray(mask, np.float64).sum(-1))
      continue
    nll_B = sequence_nll(
      params,
      jax.random.fold_in(key, i),
      x_BxL,
      None if mask is None else jnp.asarray(mask, jnp.float32),
      graphdef=graphdef,
      process=process,
      samples=samples,
    )
    per_seq.append(np.asarray(nll_B))
    if mask is None:
      counts.append(np.full(x_BxL.shape[0], x_BxL.shape[1], np.float64))
    else:
      counts.append(np.asarray(mask, np.float64).sum(-1))
  if not per_seq:
    raise ValueError('evaluation received no batches.')
  return summarize_nll(np.concatenate(per_seq), np.concatenate(counts))
