"""MDLM on LM1B: bert-base-uncased tokens, L = 128, one sentence per row.

Paper: Sahoo et al. 2024 (MDLM), LM1B test perplexity <= 27.04 (the row of
MDLM's LM1B table trained on 33B tokens). Recipe (MDLM repo ``data=lm1b``:
``wrap: False``): each sentence detokenized with MDLM's LM1B detokenizer,
tokenized as ``[CLS] ids[:126] [SEP]`` and padded to 128 with ``[PAD]``,
the padding excluded from the loss by ``batch['loss_mask']``
(``data.packing='padded'``; ``'packed'`` is the ``wrap: True`` variant);
validation = the LM1B test split; log-linear schedule, SUBS, no time
conditioning, 12 x 768 transformer, global batch 512, Adam (b2 0.999) lr 3e-4
with 2,500 warmup steps then constant, gradient clip 1.0, EMA 0.9999. Steps:
1,000,000 (MDLM's ``trainer.max_steps``); 33B tokens at 512 x 128 per step
is ~500k steps, so compare the curve at both points.

Sized for: a Cloud TPU v5p-16 slice (8 chips, 2 hosts; 64 sentences per chip)
or one 8-GPU host; ~4.4e13 FLOPs (132M parameters) and 65k token slots per
step (`--mode=plan`; docs/LAUNCH.md section 7).

Data: ``python -m ddlm_jax.data.lm1b --data_dir=~/ddlm_data/tfds`` (no
TensorFlow needed) or ``tfds build lm1b --file_format=array_record
--data_dir=~/ddlm_data/tfds``; the tokenizer is read from the HF cache
(docs/LAUNCH.md).

Launch:
  python -m experiments.run --config=experiments/configs/mdlm_lm1b.py \
    --workdir=$HOME/runs/mdlm_lm1b

Presets: ``mdlm_lm1b.py:smoke`` (seconds on CPU: tests/fixtures/lm1b, a
TFDS ArrayRecord copy with 1,200 sentences, and a TEST-ONLY WordPiece
tokenizer trained on it).
"""

from experiments.configs import common


def get_config(preset: str = ''):
  c = common.mdlm()
  c.data.corpus = 'lm1b'
  c.data.data_dir = f'{common.DATA_ROOT}/tfds'
  c.data.hf_tokenizer = 'bert-base-uncased'
  c.data.seq_len = 128
  c.data.packing = 'padded'
  c.data.wrap = 'bos_eos'
  c.data.detokenize = True
  c.data.num_threads = 4  # Sentences are tokenized on the fly.
  c.eval.num_batches = 8  # The final evaluation: all 306,688 sentences.
  return common.finish(c, preset)
