"""DDPD (planned denoising, arXiv 2410.06264) on Shakespeare characters.

Commands (the denoiser is the MDLM quickstart run, the scorer its AR
twin; train both first):
  python -m experiments.run --config=experiments/configs/mdlm_quickstart.py \
    --workdir=runs/mdlm_quickstart
  python -m experiments.run --config=experiments/configs/ar_quickstart.py \
    --workdir=runs/ar_quickstart
  python -m experiments.run --config=experiments/configs/ddpd.py \
    --workdir=runs/ddpd_planner
  python -m experiments.run --config=experiments/configs/ddpd.py \
    --workdir=runs/ddpd_planner --mode=sample \
    --config.sample.steps=64

This run trains the planner (`process.kind='ddpd_planner'`): the
quickstart's 4 x 128 transformer, time-free, with a one-logit head,
trained by binary cross-entropy to say which positions a uniform-noise
corruption replaced (ddlm_jax/diffusion/ddpd.py). Everything else is
`mdlm_quickstart.py`'s recipe (128 characters, 1000 steps of
batch 64, lr 3e-3), so the planner costs what the denoiser costs. The
reported "bound" of this run is the planner's cross-entropy in nats per
position, not a likelihood.

Sampling uses `ddpd` (ddlm_jax/sampling/ddpd.py) with the denoiser named
by `sample.light_workdir` (the second network of a two-network sampler):
T steps that each call both networks, so NFE = 2 (T + 1).

Where CPU scale departs from the paper: the paper trains both networks
on text8 and OpenWebText at 85M-parameter scale for 750k+ steps and
reports gen-PPL against GPT-2; here both are the quickstart's small
transformer on Shakespeare characters and samples are scored by the
quickstart's AR twin. Measured 2026-12-05 over 3 planner seeds
(experiments/claims/ddpd.py, `python -m experiments.benchmarks.ddpd_compare`):
at T = 32 and 64 with the few-step rule, DDPD's AR-twin gen-ppl (47-52)
is above MDLM ancestral's (31-34) and confidence decoding's (31-44) at
equal NFE, and its samples stay above the text's entropy at every
temperature swept (the planner leaves noise behind); docs/RESULTS.md
holds the verdicts.
Presets: `ddpd.py:smoke` (seconds, the tests; no samples unless
sample.light_workdir and sample.num_samples are set).
"""

from __future__ import annotations

from experiments.configs import quickstart
from experiments.configs.common import set_process

DENOISER_WORKDIR = 'runs/mdlm_quickstart'  # The MDLM denoiser's run.
SCORER_WORKDIR = 'runs/ar_quickstart'  # The AR twin that scores samples.


def get_config(preset: str = ''):
  c = quickstart.recipe(preset)
  set_process(c, 'ddpd_planner')
  c.model.time_conditioning = False
  c.sample.sampler = 'ddpd'
  if preset == 'smoke':
    c.sample.light_workdir = ''
    c.sample.scorer = ''
    c.sample.num_samples = 0
  else:
    c.sample.light_workdir = DENOISER_WORKDIR
    c.sample.scorer = SCORER_WORKDIR
  return c
