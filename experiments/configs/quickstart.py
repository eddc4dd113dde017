"""MDLM on Shakespeare characters: the suite's embedded default.

Command:
  python -m experiments.run --config=experiments/configs/quickstart.py \
    --workdir=runs/quickstart

Expected (docs/RESULTS.md): validation <= 3.3 bits/char on the held-out
plays (Hamlet, Much Ado, Richard II) with training, evaluation and sampling
inside 10 minutes on 2 CPU cores. The text's unigram entropy is 4.76 bits/char.
Presets: `quickstart.py:smoke` (seconds, used by the tests).
"""

from experiments.configs.common import apply_smoke, base_config, check_preset


def get_config(preset: str = ''):
  preset = check_preset(preset)
  c = base_config()
  c.process.kind = 'mdlm'
  c.process.schedule = 'loglinear'
  # Sized for ~10 minutes on 2 CPU cores (docs/RESULTS.md). At this budget
  # (~1e13 FLOPs) a small model is compute-optimal: width 128 reaches a lower
  # bound per minute than width 192.
  c.model.width = 128
  c.model.depth = 4
  c.model.num_heads = 4
  c.optim.learning_rate = 3e-3
  c.optim.warmup_steps = 50
  c.train.num_steps = 1000
  c.train.eval_every = 250
  c.train.checkpoint_every = 250
  c.eval.final_time_samples = 2
  if preset == 'smoke':
    apply_smoke(c)
  return c
