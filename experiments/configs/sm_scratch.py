"""MDLM with soft-masking trained from scratch on the quickstart corpus.

  python -m experiments.run --config=experiments/configs/sm_scratch.py \
    --workdir=runs/sm_scratch

The quickstart run (1000 steps, width 128) with config.soft_mask on; the
SM scalars train at their own learning rate (soft_mask.learning_rate) and
w_s starts at 0.2 (short run). Presets: `sm_scratch.py:smoke`.
"""

from experiments.configs import quickstart


def get_config(preset: str = ''):
  c = quickstart.recipe(preset)
  c.soft_mask.enabled = True
  c.soft_mask.w_s_init = 0.2
  return c
