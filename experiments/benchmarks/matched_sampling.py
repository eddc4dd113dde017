"""Sample quality at matched entropy: an arm's temperature sweep, scored by
an AR twin and read at the unigram entropy of the validation text.

Lower sample entropy alone lowers generative perplexity, so two samplers
are compared where their samples have the entropy of real text: each is
drawn at every temperature of a sweep, and its corpus gen-NLL is
interpolated in entropy at that target (`frontier.matched_value`). A
claim's sweep that does not reach the target goes on past its end
(`next_value`: hotter when the samples hold too little entropy, colder
when too much) while each new value moves the entropy toward the target,
a few values at most. Where the sweep still does not reach it the nearest
point is used and its entropy recorded, so a verdict (`Compare(...,
entropy_tol=...)`) sees the mismatch instead of a target that was never
reached.

The pieces (`target_entropy`, `draw`, `sweep`, `matched`, `row`) serve
`experiments.benchmarks.ddpd_compare` and `experiments.reproduce`, whose
claims with `spec.Sampling` arms are measured by `measure_claim`: per
training seed S every sampling arm draws from the seed-S run with
sampling seed S, and each (arm, seed) sweep is saved under OUT (see
`seed_results`) and reused by a later identical call.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time

import numpy as np

from experiments import frontier
from experiments.benchmarks import seed_results
from experiments.claims import records

# Validation windows whose unigram entropy is a claim's target (the DDPD
# comparison's 64 samples gave 4.401 bits on the quickstart corpus).
TARGET_WINDOWS = 64
# The smoke budget tests the machinery: few samples, the sweep's two ends.
SMOKE_SAMPLES = 4
# A sweep short of the target goes on past its end by this factor per
# value (1.3 -> 1.625 -> 2.03 -> 2.54; 0.8 -> 0.64 -> ...), at most
# EXTEND_POINTS values a side.
EXTEND_FACTOR = 1.25
EXTEND_POINTS = 3


def target_entropy(run, windows: int = TARGET_WINDOWS) -> float:
  """Unigram entropy (nats) of `windows` validation windows of `run`."""
  from ddlm_jax.evaluation.sample_metrics import sample_quality
  from ddlm_jax.evaluation.sample_run import reference_texts

  refs = reference_texts(run, windows)
  tokens = [run.data.tokenizer.encode(t) for t in refs]
  return sample_quality(refs, tokens)['unigram_entropy_nats']


def draw(run, sampler, *, num_samples, seed, scorer, same, light_run=None):
  """{'entropy', 'gen_nll', 'nfe', 'flops_per_sample'} of one draw (nats)."""
  from ddlm_jax.evaluation.sample_metrics import sample_quality
  from ddlm_jax.evaluation.sample_run import draw_samples

  tokens, stats = draw_samples(
    run, sampler, num_samples=num_samples, seed=seed, light_run=light_run
  )
  texts = [run.data.tokenizer.decode(r) for r in tokens]
  quality = sample_quality(texts, tokens, scorer=scorer, same_tokenizer=same)
  return {
    'entropy': quality['unigram_entropy_nats'],
    'gen_nll': math.log(quality['gen_ppl_corpus']),
    'nfe': float(stats['nfe']),
    'flops_per_sample': float(stats['flops_per_sample']),
  }


def sweep(
  run,
  name: str,
  params: dict,
  temperatures,
  *,
  num_samples: int,
  seed: int,
  scorer,
  light_run=None,
  scaled=(),
  progress=None,
  label: str = '',
) -> dict:
  """{temperature: draw} of sampler `name` with `params` over a sweep.

  With `scaled` (names of params) each sweep value multiplies those
  params instead of being the sampler's temperature: the sweep of a
  sampler that anneals its own temperatures (e.g. t_max and t_min).
  `progress` (e.g. print) gets one line per point, starting with `label`:
  a sweep at T = 1024 takes many minutes a point on a CPU.
  """
  same = scorer.tokenizer == run.data.tokenizer
  out = {}
  t0 = time.perf_counter()
  for i, temperature in enumerate(temperatures, 1):
    sampler = build(name, params, temperature, scaled)
    point = draw(
      run,
      sampler,
      num_samples=num_samples,
      seed=seed,
      scorer=scorer,
      same=same,
      light_run=light_run,
    )
    out[float(temperature)] = point
    if progress is not None:
      progress(
        point_line(label, temperature, i, len(temperatures), point)
        + f', {time.perf_counter() - t0:.0f} s'
      )
  return out


def point_line(label: str, value: float, i: int, n: int, point: dict) -> str:
  """One sweep point (value i of n) in bits and gen-ppl, for progress."""
  return (
    f'{label} sweep value {value:g} ({i}/{n}): entropy '
    f'{point["entropy"] / math.log(2):.3f} bits, gen-ppl '
    f'{math.exp(point["gen_nll"]):.2f}'
  )


def build(name: str, params: dict, temperature: float, scaled=()):
  """Sampler `name` at one sweep value: its temperature, or with `scaled`
  that value times each named param (the temperature left at 1)."""
  from ddlm_jax.sampling.registry import get_sampler

  if not scaled:
    return get_sampler(name, **params, temperature=temperature)
  return get_sampler(
    name, **{**params, **{k: params[k] * temperature for k in scaled}}
  )


def matched(points: dict, target: float) -> dict:
  """gen-NLL and entropy at the target entropy over one temperature sweep.

  `points` maps temperature -> {'entropy', 'gen_nll', ...} (nats). Inside
  the swept entropy range the entropy is the target; outside, the nearest
  point's (the value is that point's too).
  """
  temps = sorted(points, key=float)
  entropies = [points[t]['entropy'] for t in temps]
  value, _ = frontier.matched_value(
    entropies, [points[t]['gen_nll'] for t in temps], target
  )
  entropy = float(np.clip(target, min(entropies), max(entropies)))
  return {
    'gen_nll': value,
    'gen_ppl': math.exp(value),
    'entropy_bits': entropy / math.log(2),
  }


def next_value(points: dict, target: float, base) -> float | None:
  """The sweep value to draw next so the sweep reaches `target`, or None.

  `points` maps sweep value -> {'entropy', ...} (nats), `base` holds the
  sweep's own values. Below the target's entropy the next value is the
  hottest one times EXTEND_FACTOR, above it the coldest one over it.
  None once the target lies inside the swept entropies, after
  EXTEND_POINTS values past that end of `base`, or when the last value
  past the end did not move the entropy toward the target: a sampler
  whose entropy does not follow its temperature is not chased further.
  """
  by_temp = {float(t): v['entropy'] for t, v in points.items()}
  temps = sorted(by_temp)
  entropies = list(by_temp.values())
  if min(entropies) <= target <= max(entropies):
    return None
  hotter = target > max(entropies)
  edge = max(base) if hotter else min(base)
  past = [t for t in temps if (t > edge if hotter else t < edge)]
  if len(past) >= EXTEND_POINTS:
    return None
  end, inner = (temps[-1], temps[-2]) if hotter else (temps[0], temps[1])
  if past:
    gain = by_temp[end] - by_temp[inner]
    if (gain <= 0) if hotter else (gain >= 0):
      return None
  return end * EXTEND_FACTOR if hotter else end / EXTEND_FACTOR


def extend(points: dict, target: float, base, draw_at, limit=EXTEND_POINTS):
  """Adds to `points` the values `next_value` asks for, each drawn by
  `draw_at([value])` (a {value: point} dict, as `sweep` returns), at most
  `limit` of them; returns the values drawn."""
  drawn = []
  while len(drawn) < limit:
    value = next_value(points, target, base)
    if value is None:
      break
    points.update(draw_at([value]))
    drawn.append(value)
  return drawn


def row(points: dict, target: float, base=()) -> dict:
  """A sweep with its NFE, FLOPs and matched values (one arm, one seed);
  'extended' lists its values past the ends of `base`, the sweep's own."""
  first = points[next(iter(points))]
  lo, hi = (min(base), max(base)) if base else (-math.inf, math.inf)
  return {
    'sweep': {str(t): v for t, v in points.items()},
    'nfe': first['nfe'],
    'flops_per_sample': first['flops_per_sample'],
    'extended': sorted(float(t) for t in points if not lo <= float(t) <= hi),
    **matched(points, target),
  }


def describe(label: str, result: dict, target: float) -> str:
  """One progress line: NFE, matched gen-ppl and the entropy per temperature."""
  swept = ', '.join(
    f'{t}: {v["entropy"] / math.log(2):.3f}' for t, v in result['sweep'].items()
  )
  return (
    f'{label}: NFE {result["nfe"]:.0f}, gen-ppl {result["gen_ppl"]:.2f} at '
    f'{result["entropy_bits"]:.3f} bits (target {target / math.log(2):.3f}; '
    f'entropy by temperature {swept})'
  )


# --------------------------------------------- claims with Sampling arms --


def settings_of(sampling, budget: str) -> dict:
  """What a sampling arm draws with at a budget (smoke: fewer, two ends)."""
  temps = [float(t) for t in sampling.temperatures]
  num = sampling.num_samples
  if budget == 'smoke':
    temps = [min(temps), max(temps)]
    num = min(num, SMOKE_SAMPLES)
  out = {
    'sampler': sampling.sampler,
    # As JSON holds them (nested pairs become lists), so that a saved
    # result compares equal to the settings that made it.
    'params': json.loads(json.dumps(dict(sampling.params))),
    'temperatures': temps,
    'num_samples': num,
  }
  if sampling.scaled:
    out['scaled'] = list(sampling.scaled)
  return out


def check(claim) -> None:
  """Refuses a claim whose samplers would fail, before anything trains.

  Every sampling arm's sampler must be registered and accept its params
  at every value of its sweep; raises ConfigError naming the arm.
  """
  from ddlm_jax.errors import ConfigError

  for sampling in claim.samplings:
    try:
      for temperature in sampling.temperatures:
        build(
          sampling.sampler,
          dict(sampling.params),
          float(temperature),
          sampling.scaled,
        )
    except (ValueError, TypeError) as e:
      raise ConfigError(
        f'claim {claim.id}, sampling {sampling.name} ({sampling.spec()}): {e}'
      ) from None


def result_dir(out: str, arm_key: str, settings: dict) -> str:
  """OUT/ARM_KEY.SAMPLER-HASH: one sweep's results, shared by claims."""
  blob = json.dumps(settings, sort_keys=True)
  digest = hashlib.sha1(blob.encode()).hexdigest()[:8]
  return os.path.join(out, f'{arm_key}.{settings["sampler"]}-{digest}')


def seed_fields(row: dict) -> dict:
  """One seed's part of a record arm: gen-ppl at matched entropy
  ('value'), the entropy (bits) it was read at, the NFE and the sampling
  FLOPs per sample (at the sweep's first temperature)."""
  return {
    'value': row['gen_ppl'],
    'entropy': row['entropy_bits'],
    'nfe': row['nfe'],
    'flops_per_sample': row['flops_per_sample'],
  }


def arm_entry(rows: list[dict], seeds) -> dict:
  """A record's arm: ``seed_fields`` of each training seed as lists."""
  return records.arm_of(seeds, [seed_fields(r) for r in rows])


def measure_claim(
  claim,
  seeds,
  runs: dict,
  scorer_run: tuple[str, str],
  out: str,
  *,
  budget: str,
  log=print,
) -> dict:
  """Every sampling arm of `claim` on every training seed.

  Args:
    runs: {trained arm name: {seed: (workdir, arm key)}}; the key names
      the run in the saved results (so the runs directory may move).
    scorer_run: (workdir, key) of the AR scorer's run.
    out: where each (sampling arm, seed) sweep is saved and reused.

  Returns {'arms': {sampling name: record arm}, 'target_entropy_bits':
  [per seed], 'rows': {sampling name: [per-seed rows]}}. The target of
  seed S is the validation entropy of the first sampling arm's run.
  """
  from ddlm_jax.evaluation.sample_metrics import ARScorer
  from ddlm_jax.tasks.language_model import load_run

  loaded: dict[str, object] = {}

  def load(workdir):
    if workdir not in loaded:
      loaded[workdir] = load_run(workdir)
    return loaded[workdir]

  scorer = []  # Loaded on the first sweep that is not saved.

  def draw_sweep(name, settings, workdir, light_dir, seed, temperatures):
    if not scorer:
      scorer.append(ARScorer.from_run(load(scorer_run[0])))
    return sweep(
      load(workdir),
      settings['sampler'],
      settings['params'],
      temperatures,
      num_samples=settings['num_samples'],
      seed=seed,
      scorer=scorer[0],
      light_run=load(light_dir) if light_dir else None,
      scaled=settings.get('scaled', ()),
      progress=log,
      label=f'    {name} seed {seed}',
    )

  rows: dict[str, list[dict]] = {s.name: [] for s in claim.samplings}
  targets = []
  for seed in seeds:
    target = None
    for sampling in claim.samplings:
      workdir, key = runs[sampling.arm][seed]
      settings = settings_of(sampling, budget)
      file = seed_results.path(result_dir(out, key, settings), seed)
      fields = {
        'settings': settings,
        'run': f'{key}/s{seed}',
        'scorer': scorer_run[1],
      }
      light_dir = None
      if sampling.light:
        light_dir, light_key = runs[sampling.light][seed]
        fields['light'] = f'{light_key}/s{seed}'
      draw_at = functools.partial(
        draw_sweep, sampling.name, settings, workdir, light_dir, seed
      )
      saved = seed_results.load_matching(file, **fields)
      if saved is None:
        t0 = time.perf_counter()
        points = draw_at(settings['temperatures'])
        saved = {
          **fields,
          'seed': seed,
          'target_entropy_nats': target_entropy(load(workdir)),
          'sweep': {str(t): v for t, v in points.items()},
          'seconds': time.perf_counter() - t0,
        }
        seed_results.save(file, saved)
      if target is None:
        target = saved['target_entropy_nats']
      points = {float(t): v for t, v in saved['sweep'].items()}
      base = settings['temperatures']
      limit = 0 if budget == 'smoke' else EXTEND_POINTS
      if extend(points, target, base, draw_at, limit=limit):
        saved['sweep'] = {str(t): v for t, v in points.items()}
        seed_results.save(file, saved)
      result = row(points, target, base)
      rows[sampling.name].append(result)
      log('  ' + describe(f'{sampling.name} seed {seed}', result, target))
    targets.append(target / math.log(2))
  return {
    'arms': {name: arm_entry(r, seeds) for name, r in rows.items()},
    'target_entropy_bits': targets,
    'rows': rows,
    'seeds': list(seeds),
  }


def notes(claim, measured: dict, budget: str) -> str:
  """The record's notes: protocol, target, sweep and each arm's sampler."""
  arms = '; '.join(
    f'{s.name}: {s.spec()} on {s.arm}, NFE '
    f'{measured["arms"][s.name]["nfe"][0]:g}'
    for s in claim.samplings
  )
  first = settings_of(claim.samplings[0], budget)
  targets = ', '.join(f'{h:.3f}' for h in measured['target_entropy_bits'])
  text = (
    'Training seed S samples its own runs with sampling seed S; AR-twin '
    "corpus gen-ppl at the validation text's unigram entropy "
    f'({targets} bits by seed), interpolated over temperatures '
    f'{first["temperatures"]}, {first["num_samples"]} samples per point '
    f'(the scorer is one AR run, seed 0). Arms: {arms}.'
  )
  return text + extension_note(
    (f'{name} seed {seed}', r)
    for name, rows in measured['rows'].items()
    for seed, r in zip(measured['seeds'], rows)
  )


def extension_note(labelled_rows) -> str:
  """' Sweeps taken past their end ...: LABEL at VALUES; ...' for the
  (label, row) pairs whose sweep went past its end, else ''."""
  parts = [
    f'{label} at {", ".join(f"{t:.3g}" for t in row["extended"])}'
    for label, row in labelled_rows
    if row.get('extended')
  ]
  if not parts:
    return ''
  return ' Sweeps taken past their end to reach the target: ' + (
    '; '.join(parts) + '.'
  )
