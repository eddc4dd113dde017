"""MDLM on OpenWebText: GPT-2 tokens, L = 1024, MDLM's data recipe.

Paper: Sahoo et al. 2024 (MDLM), OpenWebText validation perplexity
<= 23.21 after 1M steps. Recipe (MDLM repo: ``configs/config.yaml``,
``configs/model/small.yaml``, ``data=openwebtext-split``): the last 100,000
documents are validation (``data.owt_split='mdlm'``), documents +
``<|endoftext|>`` joined and cut into rows framed as ``[BOS] ... [EOS]``
(``data.wrap='bos_eos'``), log-linear schedule, SUBS, continuous time,
antithetic t with t >= 1e-3, NO time conditioning, 12 x 768 transformer,
global batch 512 x 1024, 1,000,000 steps, Adam (b2 0.999) lr 3e-4 with 2,500
warmup steps then constant, no weight decay, gradient clip 1.0, EMA 0.9999,
bf16. (MDLM's DiT has dropout 0.1; this suite's transformer has none.)

Sized for: a Cloud TPU v5p-64 slice (32 chips, 8 hosts; 16 sequences per
chip) or 8 x H100 80GB with ``--config.optim.grad_accum_steps=2``; ~4.5e14
FLOPs and 524k tokens per step.

Data: ``python -m ddlm_jax.data.openwebtext --save_to=~/ddlm_data/openwebtext``
(once), then on each host
  python -m experiments.prepare_data --config=experiments/configs/mdlm_owt.py

Launch:
  python -m experiments.run --config=experiments/configs/mdlm_owt.py \
    --workdir=$HOME/runs/mdlm_owt
Zero-shot suite (MDLM Table 3):
  python -m experiments.zero_shot --workdir=$HOME/runs/mdlm_owt \
    --data_dir=~/ddlm_data/zero_shot

Presets: ``mdlm_owt.py:smoke`` (seconds on CPU: tests/fixtures/openwebtext,
a TEST-ONLY byte-BPE tokenizer trained on it).
"""

from experiments.configs import common


def get_config(preset: str = ''):
  c = common.mdlm()
  c.data.corpus = 'openwebtext'
  c.data.data_dir = f'{common.DATA_ROOT}/openwebtext'
  c.data.hf_tokenizer = 'gpt2'
  c.data.seq_len = 1024
  c.data.wrap = 'bos_eos'
  c.data.owt_split = 'mdlm'
  c.data.owt_validation_docs = 100_000
  c.eval.batch_size = 256  # The final evaluation: all 100k documents.
  return common.finish(c, preset)
