"""MDLM on Shakespeare characters: the suite's embedded default.

Command:
  python -m experiments.run --config=experiments/configs/quickstart.py \
    --workdir=runs/quickstart

Expected (docs/RESULTS.md): validation <= 3.3 bits/char on the held-out
plays (Hamlet, Much Ado, Richard II) with training, evaluation and sampling
inside 10 minutes on 2 CPU cores. The text's unigram entropy is 4.76 bits/char.
Presets: `quickstart.py:smoke` (seconds, used by the tests).
"""

from experiments.configs.common import apply_smoke, base_config


def get_config(preset: str = ''):
  c = base_config()
  c.process.kind = 'mdlm'
  c.process.schedule = 'loglinear'
  if preset == 'smoke':
    apply_smoke(c)
  elif preset:
    raise ValueError(f"unknown preset {preset!r}; use '' or 'smoke'.")
  return c
