"""The autoregressive twin of quickstart.py: same data, width, depth, steps.

Command:
  python -m experiments.run --config=experiments/configs/ar_quickstart.py \
    --workdir=runs/ar_quickstart

Reports exact NLL in bits/char on the same validation windows as the MDLM
quickstart (docs/RESULTS.md). Presets: `ar_quickstart.py:smoke`.
"""

from experiments.configs import quickstart
from experiments.configs.common import set_process


def get_config(preset: str = ''):
  c = quickstart.recipe(preset)
  set_process(c, 'ar')
  return c
