"""Shared pieces of the paper configs (experiments/configs/md4_*, mdlm_*, ar_*).

``small_model``: the "small" transformer of MD4/MDLM (12 blocks, width 768,
12 heads; ~85M non-embedding parameters). ``apply_paper_smoke``: the
``:smoke`` preset of a paper config, which keeps its data code path but reads
the tiny real-format fixtures under ``tests/fixtures/`` (regenerate with
``python tests/fixtures/make_fixtures.py``), trains a test-only tokenizer for
LM1B/OWT on them, and shrinks everything to run in seconds on a CPU.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import ml_collections

from experiments.configs.common import apply_smoke

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures'
DATA_ROOT = '~/ddlm_data'  # Where docs/LAUNCH.md puts the prepared data.
SMOKE_TOKENIZERS = {
  'lm1b': 'test:wordpiece',
  'openwebtext': 'test:bytebpe',
}


def small_model(c: ml_collections.ConfigDict, *, time_conditioning: bool):
  """MD4/MDLM "small": 12 x 768, 12 heads, SwiGLU MLP (GLU in MD4)."""
  c.model.width = 768
  c.model.depth = 12
  c.model.num_heads = 12
  c.model.mlp_dim = 0
  c.model.time_conditioning = time_conditioning
  c.model.cond_dim = 128
  return c


def check_preset(preset: str) -> None:
  if preset not in ('', 'smoke'):
    raise ValueError(f"unknown preset {preset!r}; use '' or 'smoke'.")


def apply_paper_smoke(
  c: ml_collections.ConfigDict,
) -> ml_collections.ConfigDict:
  """Seconds on CPU through the real data code on the shipped fixtures."""
  apply_smoke(c)
  corpus = c.data.corpus
  c.data.data_dir = str(FIXTURES / corpus)
  c.data.cache_dir = os.path.join(tempfile.gettempdir(), 'ddlm_jax_smoke')
  c.data.hf_tokenizer = SMOKE_TOKENIZERS.get(corpus, '')
  c.data.test_tokenizer_vocab = 512
  c.data.owt_validation_docs = 40
  c.data.owt_validation_fraction = 0.1
  c.model.cond_dim = 32
  c.model.dtype = 'float32'
  c.optim.learning_rate = 2e-3
  c.optim.ema_decay = 0.0
  c.optim.grad_clip = 1.0
  c.eval.batch_size = 8
  c.train.max_checkpoints = 2
  return c
