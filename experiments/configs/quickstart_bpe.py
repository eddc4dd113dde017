"""MDLM on Shakespeare in BPE tokens: the word-level quickstart.

Command (train the AR twin first: the final samples are scored by it):
  python -m experiments.run --config=experiments/configs/ar_quickstart_bpe.py \
    --workdir=runs/quickstart_bpe_ar
  python -m experiments.run --config=experiments/configs/quickstart_bpe.py \
    --workdir=runs/quickstart_bpe

The character quickstart with a byte-level BPE tokenizer trained on the
training plays (saved with the run in WORKDIR/tokenizer/). Vocabulary 2048:
it cuts the validation text to 2.69 characters per token (1024: 2.36, 4096:
2.96), so most frequent words are one token, every token type still occurs
~760 times in the 1.56M training tokens, and the output layer (2 x 128 x 2048
FLOPs per token) stays a third of the 4-layer body's cost. Sequence length 48
tokens holds ~129 characters, the character quickstart's 128.

Measured (seed 0, with --config.train.num_steps=500 because the 2 cores
were shared with ~6 other jobs, load 8-17): validation <= 8.005 +- 0.036
bits/token = 2.975 bits/char (2.691 characters per token), in 25.6 min wall
/ 535 s CPU (user + sys) for the whole run; the AR twin reached 5.899
bits/token = 2.192 bits/char. 1000 steps cost about 2 x 535 CPU-seconds,
~10 min on 2 idle cores (estimated, not measured).
Presets: `quickstart_bpe.py:smoke` (seconds, used by the tests): the
smoke model on the first characters of each Shakespeare split.
`quickstart_bpe.py:long` trains on 512-token windows (~1,380 characters)
with 6 rows per step, the same 3,072 tokens per step: the model the
decoding measurements sample at 256 and 512 tokens (parallel decoding and
approximate caches pay off only on long canvases). Its AR twin is
`ar_quickstart_bpe.py:long` in runs/quickstart_bpe_long_ar.
"""

from __future__ import annotations

import os
import tempfile

from experiments.configs import quickstart
from experiments.configs.common import Flag, apply_smoke, parse_arg

VOCAB_SIZE = 2048
SEQ_LEN = 48  # tokens; x 2.69 characters/token ~ the char quickstart's 128.
SCORER_WORKDIR = 'runs/quickstart_bpe_ar'  # The AR twin's workdir.
LONG_SEQ_LEN = 512  # The `long` preset's windows.
LONG_SCORER_WORKDIR = 'runs/quickstart_bpe_long_ar'
ARGS = (Flag('long'),)
SMOKE_VOCAB_SIZE = 300
SMOKE_CHARS = 40_000  # Characters of each split the smoke preset reads.


def smoke_files(num_chars: int = SMOKE_CHARS) -> dict[str, str]:
  """The first `num_chars` characters of each Shakespeare split, as files.

  Training BPE and encoding the whole corpus takes ~15 s, too slow for a
  test; the smoke preset reads this excerpt through data.corpus=text_files.
  Written once per excerpt size into the temp folder (rewritten if short).
  """
  from ddlm_jax.data import corpus

  folder = os.path.join(
    tempfile.gettempdir(), 'ddlm_jax_smoke', f'shakespeare_{num_chars}'
  )
  names = ('train', 'validation', 'test')
  paths = {n: os.path.join(folder, f'{n}.txt') for n in names}
  if not all(os.path.exists(p) for p in paths.values()):
    os.makedirs(folder, exist_ok=True)
    texts = corpus.load_text_splits('shakespeare')
    for name, path in paths.items():
      tmp = f'{path}.{os.getpid()}.tmp'
      with open(tmp, 'w', encoding='utf-8') as f:
        f.write(texts[name][:num_chars])
      os.replace(tmp, path)  # Atomic: parallel tests never read half.
  return paths


def apply_bpe(c, preset: str, long: bool = False):
  """The BPE data settings shared by the MDLM and its AR twin."""
  c.data.tokenizer = 'bpe'
  c.data.bpe_vocab_size = VOCAB_SIZE
  c.data.seq_len = SEQ_LEN
  # 32 rows x 48 tokens = the char quickstart's text per step; 64 doubles it.
  c.train.batch_size = 64
  if long:  # The same tokens per step in longer windows.
    c.data.seq_len = LONG_SEQ_LEN
    c.train.batch_size = 64 * SEQ_LEN // LONG_SEQ_LEN
  c.train.num_steps = 1000
  c.train.eval_every = 250
  c.train.checkpoint_every = 250
  c.sample.num_samples = 16
  if preset == 'smoke':
    apply_smoke(c)
    c.data.corpus = 'text_files'
    for name, path in smoke_files().items():
      c.data.files[name] = path
    c.data.bpe_vocab_size = SMOKE_VOCAB_SIZE
  return c


def get_config(arg: str = ''):
  long, preset = parse_arg(arg, *ARGS)
  c = quickstart.recipe('')
  apply_bpe(c, preset, long)
  scorer = LONG_SCORER_WORKDIR if long else SCORER_WORKDIR
  c.sample.scorer = '' if preset == 'smoke' else scorer
  return c
