"""The autoregressive twin of quickstart_bpe.py: same tokenizer, model, steps.

Command:
  python -m experiments.run --config=experiments/configs/ar_quickstart_bpe.py \
    --workdir=runs/quickstart_bpe_ar

Exact NLL in bits/token on the same validation windows as the BPE MDLM (the
tokenizer is trained the same deterministic way on the same text, so both
runs have identical ids); the MDLM's samples are scored under this run
(gen-ppl, MAUVE features). Measured (seed 0, --config.train.num_steps=500,
2 CPU cores shared with ~6 other jobs): exact NLL 5.899 +- 0.011 bits/token
= 2.192 bits/char, 30.9 min wall / 535 s CPU for the whole run.
Presets: `ar_quickstart_bpe.py:smoke`; `ar_quickstart_bpe.py:long` is the
twin of `quickstart_bpe.py:long` (512-token windows).
"""

from __future__ import annotations

from experiments.configs import quickstart_bpe
from experiments.configs.common import autoregressive


def get_config(arg: str = ''):
  c = quickstart_bpe.get_config(arg)
  autoregressive(c)
  c.sample.scorer = ''  # Its own samples need no scorer.
  return c
