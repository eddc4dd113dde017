"""The autoregressive baseline of mdlm_lm1b.py: same data, model, optimiser.

Paper: MDLM's LM1B table lists a retrained AR transformer at ~22.3 test
perplexity with the same 33B training tokens as MDLM's <= 27.04 (exact NLL
for AR; check the table for the precise value before quoting). Everything but
``process.kind = 'ar'`` is mdlm_lm1b.py: padded sentences of 128
bert-base-uncased tokens with ``loss_mask``, 12 x 768, global batch 512,
1,000,000 steps, lr 3e-4 constant after 2,500 warmup steps, bf16.

Sized for: a Cloud TPU v5p-16 slice or one 8-GPU host (as mdlm_lm1b.py).

Data: as mdlm_lm1b.py.

Launch:
  python -m experiments.run --config=experiments/configs/ar_lm1b.py \
    --workdir=$HOME/runs/ar_lm1b

Presets: ``ar_lm1b.py:smoke`` (seconds on CPU on tests/fixtures/lm1b).
"""

from experiments.configs import common, mdlm_lm1b


def get_config(preset: str = ''):
  return common.autoregressive(mdlm_lm1b.get_config(preset))
