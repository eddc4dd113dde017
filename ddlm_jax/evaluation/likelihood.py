"""Validation likelihood: NELBO (diffusion) or exact NLL (AR), with errors.

Each sequence's bound is averaged over `time_samples` Monte-Carlo draws of
(t, z_t); the reported standard error is over sequences (it contains both the
data spread and the remaining Monte-Carlo noise, so it is honest about both).
Units: nats/token, bits/token (= BPC on characters) and the perplexity bound
exp(nats/token). `evaluate_likelihood(..., estimator=...)` draws the samples
with one of the lower-variance estimators of `evaluation.estimators`
(masked diffusion only; others keep i.i.d. draws). A run picks it with
`eval.estimator` (`config_estimator`; default 'iid', the draws every
recorded number used), read by evaluation and the zero-shot suite alike.
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
from ddlm_jax.training.config import ConfigError


@functools.partial(jax.jit, static_argnames=('graphdef', 'process', 'samples'))
def sequence_nll(
  params, key, x_BxL, mask_BxL=None, *, graphdef, process, samples: int
):
  """Per-sequence NELBO (nats), averaged over `samples` draws: [B]."""
  apply = nnx.merge(graphdef, params)

  def one(key):
    return process.loss(apply, key, x_BxL, mask_BxL)[1]

  return jnp.mean(jax.lax.map(one, jax.random.split(key, samples)), axis=0)


def config_estimator(config, process: Process) -> str:
  """The run's `eval.estimator` ('iid' when unset), checked against its
  process before any compute.

  Non-masked processes always draw i.i.d. (their draws cannot be
  steered), so any valid name is accepted for them.
  """
  estimator = str(config.eval.get('estimator', 'iid'))
  if estimator not in est.ESTIMATORS:
    raise ConfigError(
      f'eval.estimator={estimator!r}; choose one of {est.ESTIMATORS}.'
    )
  process = process.evaluation_process
  if estimator == 'counts' and est.supports_estimators(process):
    if config.model.get('time_conditioning', False):
      raise ConfigError(
        "eval.estimator='counts' integrates t out, so the network must not "
        'read t; this run is time-conditioned: use stratified.'
      )
    if process.num_steps:
      raise ConfigError(
        "eval.estimator='counts' needs continuous time; this run has "
        f'process.num_steps={process.num_steps}: use stratified.'
      )
  return estimator


def row_nll(
  params,
  key,
  x_BxL,
  mask_BxL=None,
  *,
  graphdef,
  process: Process,
  samples: int,
  estimator: str = 'iid',
) -> np.ndarray:
  """Per-sequence bound (nats) of `samples` draws taken by `estimator`:
  float [B]. Non-masked processes, and 'iid', use `sequence_nll`."""
  if estimator != 'iid' and est.supports_estimators(process.evaluation_process):
    est.check_estimator(estimator, samples)
    if mask_BxL is None:
      mask_BxL = np.ones(np.shape(x_BxL), np.float32)
    return np.asarray(
      est.bound_draws(
        params,
        key,
        jnp.asarray(x_BxL),
        jnp.asarray(mask_BxL, jnp.float32),
        graphdef=graphdef,
        process=process.evaluation_process,
        samples=samples,
        estimator=estimator,
      ).mean(0)
    )
  return np.asarray(
    sequence_nll(
      params,
      key,
      jnp.asarray(x_BxL),
      None if mask_BxL is None else jnp.asarray(mask_BxL, jnp.float32),
      graphdef=graphdef,
      process=process,
      samples=samples,
    )
  )


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
    per_seq.append(
      row_nll(
        params,
        jax.random.fold_in(key, i),
        x_BxL,
        mask,
        graphdef=graphdef,
        process=process,
        samples=samples,
        estimator=estimator if steered else 'iid',
      )
    )
    if mask is None:
      counts.append(np.full(x_BxL.shape[0], x_BxL.shape[1], np.float64))
    else:
      counts.append(np.asarray(mask, np.float64).sum(-1))
  if not per_seq:
    raise ValueError('evaluation received no batches.')
  result = summarize_nll(np.concatenate(per_seq), np.concatenate(counts))
  # The key tells the summary lines not to print a planner's BCE as a
  # likelihood bound.
  return {**result, 'loss_is_bound': bool(process.loss_is_bound)}
