"""Uniform-state diffusion on Shakespeare characters: the quickstart's twin.

Same data, width, depth, steps and optimiser as quickstart.py (MDLM); the
process is uniform-state (UDLM: a token stays itself with probability
alpha(t), else it is resampled uniformly over the V characters; no mask
token), trained on its continuous-time NELBO with a time-conditioned network
(arXiv 2412.10193, Duo arXiv 2506.10892), sampled by uniform ancestral
sampling with Duo's greedy tail.

Command:
  python -m experiments.run --config=experiments/configs/duo_quickstart.py \
    --workdir=runs/duo_quickstart

Variants (the argument, comma-separated, optionally ending in `smoke`):
  duo_quickstart.py                UDLM (no curriculum)
  duo_quickstart.py:curriculum     Duo: the Gaussian curriculum for the
                                   first half of training, then plain
  duo_quickstart.py:interpolating  masked + uniform mixture (p_u = 0.5)
  duo_quickstart.py:smoke, duo_quickstart.py:curriculum,smoke, ...

Expected (docs/HISTORY.md section 10): a worse validation bound than the
masked quickstart at equal steps (the papers' finding on LM1B/OWT), with the
advantage of uniform-state models at few sampling steps.
"""

from experiments.configs import common, quickstart

VARIANTS = ('', 'curriculum', 'interpolating')
SMOKE_ARG = 'smoke'


ARGS = (common.Choice('variant', VARIANTS, ''),)  # '[VARIANT][,smoke]'


def get_config(arg: str = ''):
  variant, preset = common.parse_arg(arg, *ARGS)
  c = quickstart.recipe(preset)
  steps = c.train.num_steps
  common.uniform(
    c, curriculum_steps=steps // 2 if variant == 'curriculum' else 0
  )
  c.model.cond_dim = 64 if not preset else 32
  if variant == 'interpolating':
    common.set_process(c, 'interpolating', mixing=0.5)
  return c
