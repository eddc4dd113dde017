"""Validation likelihood: NELBO (diffusion) or exact NLL (AR), with errors.

Each sequence's bound is averaged over `time_samples` Monte-Carlo draws of
(t, z_t); the reported standard error is over sequences (it contains both the
data spread and the remaining Monte-Carlo noise, so it is honest about both).
Units: nats/token, bits/token (= BPC on characters) and the perplexity bound
exp(nats/token).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.training.steps import make_apply


@functools.partial(jax.jit, static_argnames=('graphdef', 'process', 'samples'))
def sequence_nll(params, key, x_BxL, *, graphdef, process, samples: int):
  """Per-sequence NELBO (nats), averaged over `samples` draws: [B]."""
  apply = make_apply(graphdef, params)

  def one(key):
    return process.loss(apply, key, x_BxL)[1]

  return jnp.mean(jax.lax.map(one, jax.random.split(key, samples)), axis=0)


def summarize_nll(nll_per_seq: np.ndarray, length: int) -> dict[str, float]:
  """Mean and standard error in nats/token, bits/token and perplexity."""
  per_token = np.asarray(nll_per_seq, np.float64) / length
  n = per_token.size
  mean = float(per_token.mean())
  stderr = float(per_token.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
  ln2 = math.log(2.0)
  return {
    'nats_per_token': mean,
    'nats_per_token_stderr': stderr,
    'bits_per_token': mean / ln2,
    'bits_per_token_stderr': stderr / ln2,
    'perplexity_bound': math.exp(mean),
    'num_sequences': n,
    'num_tokens': n * length,
  }


def evaluate_likelihood(
  params,
  graphdef,
  process,
  batches: Iterable[np.ndarray],
  *,
  key: jax.Array,
  time_samples: int = 1,
) -> dict[str, float]:
  """NELBO/NLL over `batches` of int32 [B, L]."""
  samples = 1 if process.causal else time_samples
  per_seq, length = [], None
  for i, x_BxL in enumerate(batches):
    length = x_BxL.shape[1]
    nll_B = sequence_nll(
      params,
      jax.random.fold_in(key, i),
      jnp.asarray(x_BxL),
      graphdef=graphdef,
      process=process,
      samples=samples,
    )
    per_seq.append(np.asarray(nll_B))
  if not per_seq:
    raise ValueError('evaluation received no batches.')
  return summarize_nll(np.concatenate(per_seq), length)
