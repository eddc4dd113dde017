"""MD4 on OpenWebText: GPT-2 tokens, L = 1024, md4's data recipe.

Paper: Shi et al. 2024 (MD4), OpenWebText validation perplexity <= 22.13
(MD4-S, the "small" model). Recipe (md4's ``configs/md4/openwebtext.py`` and
``prepare_openwebtext_data.py``): documents + ``<|endoftext|>`` joined and cut
into 1024-token rows (``data.wrap='eos'``), 2% of the rows held out
(``data.owt_split='md4'``; md4's own shuffle is unseeded, so the rows differ,
see ddlm_jax/data/openwebtext.py), 12 x 768 transformer with adaLN time
conditioning, linear schedule, continuous time, global batch 512 x 1024,
1,000,000 steps, Adam (b2 0.999) lr 3e-4, 2,000 warmup steps then cosine to 0,
weight decay 0.03, no clipping, EMA 0.9999, bf16 compute.

Sized for: a Cloud TPU v5p-64 slice (32 chips, 8 hosts; 16 sequences per
chip) or 8 x H100 80GB with ``--config.optim.grad_accum_steps=2``; ~4.5e14
FLOPs and 524k tokens per step.

Data: ``python -m ddlm_jax.data.openwebtext --save_to=~/ddlm_data/openwebtext``
(once; docs/LAUNCH.md), then build the token cache on each host with
  python -m experiments.prepare_data --config=experiments/configs/md4_owt.py

Launch:
  python -m experiments.run --config=experiments/configs/md4_owt.py \
    --workdir=$HOME/runs/md4_owt
Zero-shot suite afterwards (docs/LAUNCH.md):
  python -m experiments.zero_shot --workdir=$HOME/runs/md4_owt

Presets: ``md4_owt.py:smoke`` (seconds on CPU: tests/fixtures/openwebtext,
a TEST-ONLY byte-BPE tokenizer trained on it).
"""

from experiments.configs import common


def get_config(preset: str = ''):
  c = common.md4()
  c.data.corpus = 'openwebtext'
  c.data.data_dir = f'{common.DATA_ROOT}/openwebtext'
  c.data.hf_tokenizer = 'gpt2'
  c.data.seq_len = 1024
  c.data.wrap = 'eos'
  c.data.owt_split = 'md4'
  c.data.owt_validation_fraction = 0.02
  c.eval.batch_size = 256  # The final evaluation: all ~176k held-out rows.
  return common.finish(c, preset)
