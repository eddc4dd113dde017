"""MDLM on Shakespeare characters: the transformer, NELBO-trained quickstart.

Command:
  python -m experiments.run --config=experiments/configs/mdlm_quickstart.py \
    --workdir=runs/mdlm_quickstart

This was quickstart.py until 2026-12-02 (same keys, same numbers): 4 layers,
width 128, the NELBO objective, 1000 steps. It is the base that the
quickstart's twins compare with (`ar_quickstart.py`, `duo_quickstart.py`,
`mdlm_ce.py`) and fine-tune from (`bd3_quickstart.py`, `sm_continue.py`
read `runs/mdlm_quickstart`). Expected (docs/HISTORY.md section 1):
3.298 +- 0.034 bits/char over 3 seeds (3.258-3.318) on the held-out plays,
in 6-9 minutes on 2 CPU cores. Presets: `mdlm_quickstart.py:smoke`.
"""

from experiments.configs import quickstart


def get_config(preset: str = ''):
  return quickstart.recipe(preset)
