"""DDPD, discrete diffusion with planned denoising (arXiv 2410.06264).

For training seed S the planner (`experiments/configs/ddpd.py`, seed S)
pairs with the MDLM quickstart's seed-S run as its denoiser, which also
draws the baselines' samples, and the quickstart's AR twin scores all of
them (`experiments.benchmarks.ddpd_compare`, one process per seed; the
denoiser and scorer runs are the ones the other quickstart claims train).
Equal NFE counts both of DDPD's networks: T planner-denoiser steps plus
the final pass are 2 (T + 1) calls, so the baselines run 2 (T + 1) steps
without caching (T = 32: 66, T = 64: 130). With T < L, DDPD runs the
paper's few-step sampler (`ddpd:parallel=True`: each step denoises the
planner's estimate of the noisy positions left over the steps left).
Entropies are matched by the temperature of the denoiser's draws
(`ENTROPY_TOL`). The paper's text8 and OpenWebText networks are ~85M
parameters against these 0.9M.
"""

import functools

from experiments.claims.spec import (
  AR_SCORER,
  ENTROPY_TOL,
  MATCHED_ENTROPY,
  Arm,
  Claim,
  Measurement,
)
from experiments.claims.uniform import MDLM
from experiments.claims.verdict import Compare

_PAPER = 'DDPD'
_ARXIV = '2410.06264'
# The quickstart's 0.9M-parameter networks over the paper's ~85M.
_SCALE = 0.9e6 / 85e6
_PLANNER = Arm('planner', 'experiments/configs/ddpd.py')
_RUNS = (
  '--planner={run:planner}',
  '--denoiser={run:mdlm}',
  '--scorer={scorer}',
)


def matched_arms(result: dict, steps: int, arms) -> dict[str, dict]:
  """One seed's arms at T = steps from ddpd_compare's result: gen-ppl at
  matched entropy with the entropy, NFE and FLOPs it was read at."""
  from experiments.benchmarks.matched_sampling import seed_fields

  rows = result['steps'][str(steps)]
  return {arm: seed_fields(rows[arm]) for arm in arms}


def matched_notes(results) -> str:
  """What the DDPD claims' gen-ppl was read at, from ddpd_compare's
  result of every planner seed (the runs themselves are named by the
  record's own notes, relative to the repository)."""
  from experiments.benchmarks.matched_sampling import extension_note

  first = results[0]
  settings = first['settings']
  return (
    "AR-twin corpus gen-ppl at the validation text's unigram entropy "
    f'({first["target_entropy_bits"]:.3f} bits), interpolated over the '
    f'denoiser temperatures {settings["temperatures"]} with '
    f'{settings["num_samples"]} samples per point; each baseline draws '
    "with its planner seed's sampling seed."
  ) + extension_note(
    (f'{arm} seed {result["seed"]} T = {steps}', row)
    for result in results
    for steps, rows in result['steps'].items()
    for arm, row in rows.items()
  )


def _measurement(steps: int, baseline: str) -> Measurement:
  """Every arm at both T, one process per seed (the four claims share it)."""
  return Measurement(
    'experiments.benchmarks.ddpd_compare',
    (*_RUNS, '--steps=32,64'),
    '',
    functools.partial(matched_arms, steps=steps, arms=('ddpd', baseline)),
    result_flag='--out',
    result_file='s{seed}/result.json',
    per_seed=True,
    smoke_args=(
      *_RUNS, '--steps=32,64', '--temperatures=0.9,1.0', '--num_samples=2',
      '--extend_points=0',
    ),
    describe=matched_notes,
  )  # fmt: skip


def _beats(steps: int, baseline: str) -> Claim:
  return Claim(
    id=f'ddpd-beats-{baseline}-t{steps}',
    family='samplers',
    paper=_PAPER,
    arxiv=_ARXIV,
    table='text8 / OWT sampling, equal NFE',
    statement=f'DDPD (T = {steps}, planner + MDLM denoiser) gives lower '
    f'AR-twin gen-ppl than MDLM {baseline} sampling at equal NFE (both '
    'networks counted) and matched entropy.',
    paper_value='lower gen-ppl than mask-diffusion sampling at equal NFE, '
    'most of all at few steps',
    metric='AR-twin gen-ppl',
    protocol=MATCHED_ENTROPY,
    rule=Compare('ddpd', baseline, 'lower', entropy_tol=ENTROPY_TOL),
    arms=(MDLM, _PLANNER),
    scorer=AR_SCORER,
    measurement=_measurement(steps, baseline),
    command=f'python -m experiments.reproduce ddpd-beats-{baseline}-t{steps}',
    budget_fraction=_SCALE,
    # Three MDLM runs, three planners and the AR scorer (~5 min each on
    # 2 cores), then 3 arms x 2 T x 5 temperatures x 64 samples per seed
    # (~10 min): 62 min for all four claims from nothing (2026-12-06).
    cost_minutes=65,
  )


CLAIMS = tuple(
  _beats(steps, baseline)
  for baseline in ('ancestral', 'confidence')
  for steps in (32, 64)
)
