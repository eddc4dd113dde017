"""Sampling from a Run with measurements: the body of `--mode=sample`.

`draw_samples` runs one sampler on a restored run, compiled ahead of time so
that the timed execution excludes compilation, and reports NFE, FLOPs (per
network for model scheduling) and wall-clock rates. `sample_and_score` adds
the content metrics, gen-ppl from an AR scorer run and MAUVE, as configured
in the run's `sample` block (keys documented in experiments/configs/common).
`write_samples` stores each call's samples in files of their own
(samples.txt, then samples_2.txt, ... or samples_NAME.txt), so a later
call never overwrites an earlier one.
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.evaluation import cost
from ddlm_jax.evaluation.sample_metrics import (
  ARScorer,
  sample_quality,
  throughput,
)
from ddlm_jax.sampling import block as block_sampling
from ddlm_jax.sampling.autoregressive import autoregressive_sample
from ddlm_jax.sampling.common import generate_id, prefix_prompt
from ddlm_jax.sampling.registry import sampler_from_config
from ddlm_jax.training import metrics as records
from ddlm_jax.training import progress
from ddlm_jax.training.config import ConfigError


def _cfg_get(cfg, key, default=None):
  return cfg.get(key, default) if hasattr(cfg, 'get') else default


def make_apply(graphdef, params):
  """The network of a parameter dict (the merged NNX module)."""
  return nnx.merge(graphdef, params)


def model_flops(run, batch: int, length: int) -> float:
  """Forward FLOPs of one call of the run's network (as built)."""
  return run.forward_flops(batch, length)


def check_time_free(sampler, time_conditioning: bool):
  """ValueError if the sampler needs a time-free network and has none."""
  if not (sampler.needs_time_free and time_conditioning):
    return
  if 'block' in getattr(type(sampler), 'families', ()):
    raise ValueError(
      f'sampler {sampler.name!r} calls the network without a time (block '
      'diffusion is time-free, as in BD3-LM); set '
      '--config.model.time_conditioning=False.'
    )
  raise ValueError(
    f'sampler {sampler.name!r} with caching needs a time-free network; set '
    '--config.sample.use_cache=False (or use_cache=False in its params) '
    'for time-conditioned models.'
  )


def draw_samples(
  run,
  sampler=None,
  *,
  num_samples: int,
  seed: int = 0,
  light_run=None,
  prompt_BxL=None,
  calls: int = 1,
):
  """Samples from a run; returns (tokens [calls * N, L] numpy, stats).

  `calls` > 1 repeats the compiled sampler with seeds seed, seed + 1, ...
  (e.g. batch 1 for per-sample NFE of adaptive samplers, whose batched NFE
  is set by the slowest row); NFE is then the mean per call.

  Args:
    sampler: a ddlm_jax.sampling sampler (None: from run.config.sample);
      ignored for AR runs.
    light_run: the light network's run for the 'scheduled' sampler.
  """
  length = run.settings.data.seq_len
  apply = make_apply(run.graphdef, run.eval_params())
  flops_per_call = [model_flops(run, num_samples, length)]
  if run.process.causal:
    cfg = run.config.sample
    fn = lambda key: autoregressive_sample(
      apply,
      key,
      run.process,
      batch=num_samples,
      length=length,
      temperature=cfg.temperature,
      top_k=cfg.top_k,
      top_p=cfg.top_p,
      prefix_BxP=prompt_BxL,  # The AR run's prompt: token ids only.
    )
    name, steps = 'autoregressive', length
  else:
    if sampler is None:
      sampler = sampler_from_config(
        run.config.sample, eos_id=getattr(run, 'eos_id', None)
      )
    check_time_free(sampler, run.config.model.time_conditioning)
    if sampler.num_models == 2:
      if light_run is None:
        raise ValueError(
          f'sampler {sampler.name!r} needs a light network: set '
          '--config.sample.light_workdir to a trained run directory.'
        )
      light = make_apply(light_run.graphdef, light_run.eval_params())
      apply = (apply, light)
      flops_per_call.append(model_flops(light_run, num_samples, length))
    prompt = None if prompt_BxL is None else jnp.asarray(prompt_BxL)
    kwargs = dict(batch=num_samples, length=length, prompt_BxL=prompt)
    if hasattr(sampler, 'generate'):
      # Block samplers: each call runs one block against the KV cache, so
      # FLOPs come from the work they count, not NFE x a full forward.
      def fn(key):
        out = sampler.generate(apply, key, run.process, **kwargs)
        return out.tokens_BxL, out.nfe, out.cost

    else:
      fn = lambda key: sampler(apply, key, run.process, **kwargs)
    name, steps = sampler.name, getattr(sampler, 'num_steps', length)
  with progress.timed(f'sampling: compiling {name} ({num_samples} x {length})'):
    compiled = jax.jit(fn).lower(jax.random.key(seed)).compile()
  tokens, nfes, seconds, work = [], [], 0.0, []
  for r in range(calls):
    t0 = time.perf_counter()
    tok, nfe, *cost_of_call = compiled(jax.random.key(seed + r))
    tokens.append(np.asarray(tok))
    seconds += time.perf_counter() - t0
    nfes.append(np.asarray(nfe))
    work += cost_of_call
    if calls > 1:
      eta = seconds / (r + 1) * (calls - r - 1)
      print(
        f'sampling: batch {r + 1}/{calls} ({(r + 1) * num_samples} '
        f'samples, {seconds:.1f}s, {(r + 1) * num_samples / seconds:.1f} '
        f'samples/s, ETA {records.format_duration(eta)})',
        flush=True,
      )
  tokens = np.concatenate(tokens)
  nfe = np.mean(nfes, axis=0)  # per call
  total = tokens.shape[0]
  stats = throughput(total, tokens.shape[1], seconds, nfe)
  if work:
    # A sampler that counts work of its own kind converts it (PGM's
    # encoder and decoder); block samplers count a Transformer's.
    estimate = getattr(sampler, 'estimate_flops', block_sampling.estimate_flops)
    flops = sum(estimate(run.model_config, w, num_samples) for w in work)
  else:
    flops = sum(cost.sampling_flops(n, flops_per_call) for n in nfes)
  stats.update(
    sampler=name,
    sampler_params=params_of(sampler),
    steps=int(steps),
    num_samples=total,
    batch=num_samples,
    nfe=float(np.sum(nfe)) if calls > 1 else int(np.sum(nfe)),
    sample_tokens_per_sec=stats['tokens_per_sec'],
    # Every call serves its whole batch: NFE per sample = NFE per call.
    nfe_per_sample=float(np.sum(nfe)),
    flops_per_call=[float(f) for f in flops_per_call],  # whole batch
    flops_per_sample=flops / total,
    flops_total=flops,
  )
  if calls > 1:
    stats['nfe_calls'] = [float(np.sum(n)) for n in nfes]
  if nfe.ndim:
    stats['nfe_per_model'] = dict(zip(('heavy', 'light'), nfe.tolist()))
  return tokens, stats


def params_of(sampler) -> dict:
  """Every field of a sampler, defaults included ({} for None)."""
  if sampler is None:
    return {}
  import dataclasses

  return {f.name: getattr(sampler, f.name) for f in dataclasses.fields(sampler)}


def reference_texts(run, num: int, split: str = 'validation') -> list[str]:
  """`num` evenly spaced windows of real text (MAUVE's reference)."""
  data = run.data.splits.get(split)
  if data is None:
    raise ValueError(f'split {split!r} missing; have {list(run.data.splits)}.')
  length = run.settings.data.seq_len
  starts = np.linspace(0, max(0, data.size - length), num).astype(int)
  return [run.data.tokenizer.decode(data[s : s + length]) for s in starts]


def sample_and_score(run, *, scorer=None, scorer_run=None, light_run=None):
  """--mode=sample: samples per run.config.sample; returns (texts, stats).

  Args:
    scorer: an ARScorer; else one from scorer_run (none: no gen-ppl /
      MAUVE). `Run.sample` loads the run named by config.sample.scorer.
    light_run: the light network's run ('scheduled'); `Run.sample` loads
      config.sample.light_workdir.
  """
  cfg = run.config.sample
  num = int(cfg.num_samples)
  # Large requests run as ceil(num / batch) calls of one compiled sampler,
  # with a progress line per call, instead of one huge batch.
  batch = min(num, int(_cfg_get(cfg, 'batch_size', 0)) or num)
  calls = -(-num // batch)
  prompt = None
  prefix = _cfg_get(cfg, 'prefix', '')
  if prefix and run.process.causal:
    prompt = run.data.tokenizer.encode(prefix)[None].repeat(batch, 0)
  elif prefix:
    ids = run.data.tokenizer.encode(prefix)[None].repeat(batch, 0)
    prompt = prefix_prompt(
      ids, run.settings.data.seq_len, generate_id(run.process)
    )
  tokens, stats = draw_samples(
    run,
    num_samples=batch,
    seed=int(cfg.seed),
    light_run=light_run,
    prompt_BxL=prompt,
    calls=calls,
  )
  if tokens.shape[0] > num:
    tokens = tokens[:num]
    stats['num_samples'] = num
  texts = [run.data.tokenizer.decode(row) for row in tokens]
  if scorer is None and scorer_run is not None:
    scorer = ARScorer.from_run(scorer_run)
    stats['scorer'] = scorer_run.workdir
  same = scorer is not None and scorer.tokenizer == run.data.tokenizer
  use_mauve = bool(_cfg_get(cfg, 'mauve', False)) and scorer is not None
  stats.update(
    sample_quality(
      texts,
      tokens,
      scorer=scorer,
      same_tokenizer=same,
      reference_texts=reference_texts(run, num) if use_mauve else None,
      mauve=use_mauve,
    )
  )
  return texts, stats


_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]*')


def _paths(workdir: str, suffix: str) -> tuple[str, str]:
  return (
    records.join(workdir, f'samples{suffix}.txt'),
    records.join(workdir, f'sample_stats{suffix}.json'),
  )


def output_paths(workdir: str, name: str = '') -> tuple[str, str]:
  """(samples, stats) paths for a new sampling call, neither existing yet.

  Unnamed calls take samples.txt / sample_stats.json, then samples_2.txt /
  sample_stats_2.json, and so on; a named call takes samples_NAME.txt /
  sample_stats_NAME.json and is refused (ConfigError, before any compute
  when called first) if they exist.
  """
  if name:
    if not _NAME.fullmatch(name):
      raise ConfigError(
        f'--name={name!r}: use letters, digits, _ . - (it names '
        'samples_NAME.txt).'
      )
    paths = _paths(workdir, f'_{name}')
    taken = [p for p in paths if records.exists(p)]
    if taken:
      raise ConfigError(
        f'--name={name}: {taken[0]} exists already; choose another name '
        '(earlier samples are never overwritten).'
      )
    return paths
  n = 1
  while True:
    paths = _paths(workdir, '' if n == 1 else f'_{n}')
    if not any(records.exists(p) for p in paths):
      return paths
    n += 1


def name_samples(config, workdir: str, name: str):
  """Names a run's sample files (config.sample.name; the --name flag).

  Refuses a name whose files exist before anything is computed.
  """
  if not name:
    return
  output_paths(workdir, name)
  with config.unlocked():
    config.sample.name = name


def write_samples(workdir: str, texts, stats: dict, name: str = ''):
  """Writes the samples and their stats to new files; returns their paths."""
  txt, stats_path = output_paths(workdir, name)
  records.write_text(
    txt, ''.join(f'=== sample {i} ===\n{t}\n\n' for i, t in enumerate(texts))
  )
  records.write_json(stats_path, stats)
  return txt, stats_path
