"""MDM-Prime (partial masking, arXiv 2505.18495) on the BPE quickstart.

Commands (train the AR twin first: the final samples are scored by it):
  python -m experiments.run --config=experiments/configs/ar_quickstart_bpe.py \
    --workdir=runs/quickstart_bpe_ar
  python -m experiments.run --config=experiments/configs/mdm_prime.py:l2 \
    --workdir=runs/mdm_prime_l2
  python -m experiments.run --config=experiments/configs/mdm_prime.py:binary \
    --workdir=runs/mdm_prime_binary
  python -m experiments.run --config=experiments/configs/mdm_prime.py:l2 \
    --workdir=runs/mdm_prime_l2 --mode=sample

Everything but the process is `quickstart_bpe.py`'s MDLM recipe (BPE
vocabulary 2048, 48 tokens, the 4 x 128 transformer, 1000 steps of batch
64, the log-linear schedule with t_min = 1e-3), so the bound is compared
with MDLM's at equal steps; the network costs the same per step up to the
input layer (a multi-hot row of V = 2048 entries times the table instead
of a gather) and the carry-over and sub-token marginals in the loss.
Variants: `l2` (the default: l = 2 digits of base 46 per token, the
paper's best text setting), `binary` (l = ceil(log2 2048) = 11 bits).
Samples use `prime_ancestral` (sub-token ancestral sampling that calls
the network only after a digit changed).

Where CPU scale departs from the paper: the paper trains on OpenWebText
(GPT-2 vocabulary, 1024 tokens, 130M-parameter DiT, 1M steps) and embeds
each digit in d / l columns concatenated; here the slot embeddings are
summed at full width (ddlm_jax/diffusion/prime.py says why), the corpus
is Shakespeare and the budget ~1e13 FLOPs. Paper: OpenWebText perplexity
<= 15.36 for MDM-Prime against MDLM's 21.52. Measured 2026-12-05 over 3
seeds (experiments/claims/prime.py): MDLM 7.475 +- 0.12 bits/token, l2
7.548 +- 0.09, binary 7.965 +- 0.13, at ~6e-6 of the paper's budget;
docs/RESULTS.md holds the verdicts.
Presets: `mdm_prime.py:smoke`, `mdm_prime.py:binary,smoke` (seconds, the
tests).
"""

from __future__ import annotations

from experiments.configs import quickstart, quickstart_bpe
from experiments.configs.common import Choice, parse_arg, set_process

VARIANTS = ('l2', 'binary')
ARGS = (Choice('variant', VARIANTS, 'l2'),)  # '[l2|binary][,smoke]'


def get_config(arg: str = ''):
  variant, preset = parse_arg(arg, *ARGS)
  c = quickstart.recipe('')
  set_process(c, 'mdm_prime', subtokens=2, binary=variant == 'binary')
  quickstart_bpe.apply_bpe(c, preset)
  c.sample.sampler = 'prime_ancestral'
  c.sample.scorer = '' if preset == 'smoke' else quickstart_bpe.SCORER_WORKDIR
  return c
