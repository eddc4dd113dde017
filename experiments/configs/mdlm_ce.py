"""MDLM trained on the simple cross-entropy objective (arXiv 2602.15014).

The transformer MDLM of the quickstart recipe (`mdlm_quickstart.py`) with
`process.loss_type='simple_ce'`: training minimises the unweighted
cross-entropy of the masked tokens averaged over all tokens (no 1/t ELBO
weight); validation still reports the NELBO, so the two are compared on the
same bound. The scaling study reports this objective ~12% more
FLOPs-efficient than the NELBO-weighted one at 50M-1.7B parameters.

Command:
  python -m experiments.run --config=experiments/configs/mdlm_ce.py \
    --workdir=runs/mdlm_ce

Its NELBO-weighted arm is `mdlm_quickstart.py`. Since 2026-12-02
quickstart.py trains on this objective too, with the hybrid backbone.

Presets: `mdlm_ce.py:smoke`. Model size for the FLOPs study:
`--config.model.width=64|128|192` (docs/HISTORY.md section 10).
"""

from experiments.configs import quickstart


def get_config(preset: str = ''):
  c = quickstart.recipe(preset)
  c.process.loss_type = 'simple_ce'
  return c
