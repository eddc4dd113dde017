"""The autoregressive baseline of mdlm_owt.py: same data, model, optimiser.

Paper: MDLM's retrained AR transformer on OpenWebText reaches validation
perplexity ~17.5 (exact NLL, not a bound), against MDLM's <= 23.21.
Everything but ``process.kind = 'ar'`` (causal attention, exact NLL, a BOS
input) is mdlm_owt.py: 12 x 768, global batch 512 x 1024,
1,000,000 steps, lr 3e-4 constant after 2,500 warmup steps, bf16.

Sized for: a Cloud TPU v5p-64 slice or 8 x H100 80GB (as mdlm_owt.py).

Data: as mdlm_owt.py (the token cache is shared: same tokenizer, same split).

Launch:
  python -m experiments.run --config=experiments/configs/ar_owt.py \
    --workdir=$HOME/runs/ar_owt

Presets: ``ar_owt.py:smoke`` (seconds on CPU on tests/fixtures/openwebtext).
"""

from experiments.configs import common, mdlm_owt


def get_config(preset: str = ''):
  return common.autoregressive(mdlm_owt.get_config(preset))
