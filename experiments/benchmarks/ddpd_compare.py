"""DDPD against MDLM's samplers at equal NFE and matched entropy.

  python -m experiments.benchmarks.ddpd_compare \
    --planner=runs/ddpd_planner_0 --planner=runs/ddpd_planner_1 \
    --planner=runs/ddpd_planner_2 --denoiser=runs/mdlm_quickstart \
    --scorer=runs/ar_quickstart [--steps=32,64] \
    [--temperatures=0.8,0.9,1.0,1.15,1.3] [--num_samples=64] \
    [--extend_points=3]

Each --planner is one training seed of the DDPD planner (its seed is read
from the run's config); every DDPD sample pairs it with the one MDLM
denoiser run. At each T in --steps, DDPD takes T planner-denoiser steps
and a final pass: 2 (T + 1) network calls, both networks counted. The
baselines, MDLM ancestral (without its skip-idle-steps cache, so every
step is a call) and confidence decoding, run 2 (T + 1) steps on the
denoiser: the same NFE. Planner seed s draws its samples with sampling
seed s, and the baselines draw theirs with the same seed, so the three
arms are paired per seed.

Quality is the AR twin's corpus gen-ppl at matched entropy
(`matched_sampling`): every arm is swept over --temperatures (the
denoiser's draws; the planner's position choice keeps temperature 1),
and its gen-NLL is interpolated at the unigram entropy of the validation
text. A sweep that does not reach that entropy goes on past its end
(`matched_sampling.extend`); where it still does not, the nearest point
is used and its entropy recorded, so the verdict can see the mismatch.
FLOPs per sample (both of DDPD's networks) are in the results.

Per seed the result is saved as OUT/sS/result.json with its settings
and reused by a later identical call. `python -m experiments.reproduce
ddpd-beats-ancestral-t32` (or any of the four `ddpd-beats-*` claims,
experiments/claims/ddpd.py) trains the runs and runs this once per seed.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import time

from experiments.benchmarks import matched_sampling, seed_results

BASELINES = {
  'ancestral': ('ancestral', {'use_cache': False}),
  'confidence': ('confidence', {}),
}
SETTINGS = (
  'denoiser',
  'scorer',
  'steps',
  'temperatures',
  'num_samples',
  'extend_points',
)


def baseline_steps(ddpd_steps: int) -> int:
  """The baselines' step count at DDPD's NFE: T steps of two networks and
  the final pass of both."""
  return 2 * (ddpd_steps + 1)


def _arms_at(steps: int):
  """[(arm, sampler name, params, uses the planner)] at DDPD's T."""
  arms = [('ddpd', 'ddpd', {'num_steps': steps, 'parallel': True}, True)]
  for arm, (name, params) in BASELINES.items():
    arms.append(
      (arm, name, {**params, 'num_steps': baseline_steps(steps)}, False)
    )
  return arms


def resolved(name: str, params: dict) -> dict:
  """Every field of the sampler that name and params build."""
  from ddlm_jax.evaluation.sample_run import params_of
  from ddlm_jax.sampling import get_sampler

  return params_of(get_sampler(name, **params))


def measure_planner(planner_dir: str, args) -> dict:
  """Every arm at every T and temperature for one planner seed."""
  from ddlm_jax.evaluation.sample_metrics import ARScorer
  from ddlm_jax.tasks.language_model import load_run

  planner = load_run(planner_dir)
  seed = int(planner.config.seed)
  settings = {k: getattr(args, k) for k in SETTINGS}
  # The arms' sampler settings too, defaults resolved: a changed sampler
  # (or a changed default) is measured again.
  settings['arms'] = {
    str(t): [[a, n, resolved(n, p)] for a, n, p, _ in _arms_at(t)]
    for t in args.steps
  }
  saved = seed_results.path(args.out, seed)
  old = seed_results.load_matching(
    saved, settings=settings, planner=planner_dir
  )
  if old is not None:
    return old
  denoiser = load_run(args.denoiser)
  if planner.data.tokenizer != denoiser.data.tokenizer:
    raise ValueError(
      f'{planner_dir} and {args.denoiser} have different tokenizers; train '
      'the planner on the denoiser corpus.'
    )
  scorer = ARScorer.from_run(load_run(args.scorer))
  target = matched_sampling.target_entropy(denoiser, args.num_samples)
  t0 = time.perf_counter()
  out = {}
  for steps in args.steps:
    for arm, name, params, planned in _arms_at(steps):
      draw_at = functools.partial(
        matched_sampling.sweep,
        planner if planned else denoiser,
        name,
        params,
        num_samples=args.num_samples,
        seed=seed,
        scorer=scorer,
        light_run=denoiser if planned else None,
        progress=lambda line: print(line, flush=True),
        label=f'  seed {seed} T={steps} {arm}',
      )
      points = draw_at(args.temperatures)
      matched_sampling.extend(
        points, target, args.temperatures, draw_at, limit=args.extend_points
      )
      row = matched_sampling.row(points, target, args.temperatures)
      out.setdefault(str(steps), {})[arm] = row
      label = f'seed {seed} T={steps} {arm}'
      print(matched_sampling.describe(label, row, target), flush=True)
  result = {
    'planner': planner_dir,
    'seed': seed,
    'target_entropy_bits': target / math.log(2),
    'steps': out,
    'seconds': time.perf_counter() - t0,
    'settings': settings,
  }
  seed_results.save(saved, result)
  return result


def make_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--planner', action='append', required=True)
  p.add_argument('--denoiser', required=True)
  p.add_argument('--scorer', required=True)
  p.add_argument('--steps', default='32,64')
  p.add_argument('--temperatures', default='0.8,0.9,1.0,1.15,1.3')
  p.add_argument('--num_samples', type=int, default=64)
  p.add_argument(
    '--extend_points',
    type=int,
    default=matched_sampling.EXTEND_POINTS,
    help='at most this many temperatures past each end of a sweep that '
    'does not reach the target entropy (0: none)',
  )
  p.add_argument('--out', default=os.path.join('runs', 'ddpd_compare'))
  return p


def check_args(args) -> None:
  """Refuses bad flags before any run is loaded."""
  args.steps = [int(s) for s in str(args.steps).split(',') if s]
  args.temperatures = [float(t) for t in str(args.temperatures).split(',') if t]
  if not args.steps or min(args.steps) < 1:
    raise SystemExit(
      f'--steps={args.steps}: give positive integers, e.g. 32,64'
    )
  if len(args.temperatures) < 2 or min(args.temperatures) <= 0:
    raise SystemExit(
      f'--temperatures={args.temperatures}: give at least two positive '
      'values to interpolate over, e.g. 1.0,1.15,1.3'
    )
  if args.num_samples < 2:
    raise SystemExit(f'--num_samples={args.num_samples}: give at least 2')
  if args.extend_points < 0:
    raise SystemExit(
      f'--extend_points={args.extend_points}: give 0 (no extension) or more'
    )
  for path in [*args.planner, args.denoiser, args.scorer]:
    if not os.path.exists(os.path.join(path, 'config.json')):
      raise SystemExit(
        f'{path} is not a trained run (no config.json); train it first'
      )


def main(argv=None) -> list[dict]:
  args = make_parser().parse_args(argv)
  check_args(args)
  results = [measure_planner(p, args) for p in args.planner]
  return results


if __name__ == '__main__':
  main()
