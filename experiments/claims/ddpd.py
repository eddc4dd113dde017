"""DDPD, discrete diffusion with planned denoising (arXiv 2410.06264).

The planner runs train `experiments/configs/ddpd.py` (3 seeds, into
runs/ddpd_planner_0, _1, _2 with --config.seed=S); the
denoiser of every DDPD sample is the MDLM quickstart run
(`runs/mdlm_quickstart`), which also draws the baselines' samples, and
the quickstart's AR twin scores all of them. Equal NFE counts both of
DDPD's networks: T planner-denoiser steps plus the final pass are 2 (T +
1) calls, so the baselines run 2 (T + 1) steps without caching (T = 32:
66, T = 64: 130). With T < L, DDPD runs the paper's few-step sampler
(`ddpd:parallel=True`: each step denoises the planner's estimate of the
noisy positions left over the steps left). Entropies are matched by the
temperature of the denoiser's draws (`ENTROPY_TOL`). The paper's text8
and OpenWebText networks are ~85M parameters against these 0.9M.
`experiments.benchmarks.ddpd_compare` draws every arm and writes the
four records.
"""

from experiments.claims.spec import (
  ENTROPY_TOL,
  MATCHED_ENTROPY,
  Claim,
)
from experiments.claims.verdict import Compare

_PAPER = 'DDPD'
_ARXIV = '2410.06264'
_BENCH = 'python -m experiments.benchmarks.ddpd_compare'
# The quickstart's 0.9M-parameter networks over the paper's ~85M.
_SCALE = 0.9e6 / 85e6
# Three planner seeds, then every arm of the four claims in one call.
_COMMAND = (
  'for s in 0 1 2; do python -m experiments.run '
  '--config=experiments/configs/ddpd.py --workdir=runs/ddpd_planner_$s '
  '--config.seed=$s --config.sample.num_samples=0; done; '
  f'{_BENCH} --planner=runs/ddpd_planner_0 --planner=runs/ddpd_planner_1 '
  '--planner=runs/ddpd_planner_2 --denoiser=runs/mdlm_quickstart '
  '--scorer=runs/ar_quickstart --steps=32,64 --record'
)


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
    command=_COMMAND,
    budget_fraction=_SCALE,
    cost_minutes=60,
  )


CLAIMS = tuple(
  _beats(steps, baseline)
  for baseline in ('ancestral', 'confidence')
  for steps in (32, 64)
)
