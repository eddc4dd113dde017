"""One batch path: text corpora are sources, and their batches are the ones
the token-array pipeline cut before they became sources.

The reference below is the pre-source text path written out from the
pipeline's own functions: read the splits, fit the tokenizer on the train
text, encode, then `pipeline.train_iterator` / `pipeline.eval_batches` on
the encoded arrays. Same data order and RNG means the quickstart's bound
is unchanged.
"""

import dataclasses
import json
import re

import numpy as np
import pytest

from ddlm_jax.data import corpus, pipeline, source_registry, tokenizers
from ddlm_jax.data.settings import DataConfig, TextFiles
from ddlm_jax.training import builders
from ddlm_jax.training.config import ConfigError
from experiments.configs import common, quickstart, quickstart_bpe


def _reference_splits(cfg: DataConfig):
  """Token arrays as the text path built them before it was a source."""
  kwargs = cfg.files.given() if cfg.corpus == 'text_files' else {}
  texts = corpus.load_text_splits(cfg.corpus, **kwargs)
  tok_kwargs = {}
  if cfg.tokenizer == 'bpe':
    tok_kwargs['vocab_size'] = cfg.bpe_vocab_size
  tok = tokenizers.build_tokenizer(cfg.tokenizer, texts['train'], **tok_kwargs)
  return tok, {name: tok.encode(t) for name, t in texts.items() if t}


@pytest.mark.parametrize(
  'config',
  [
    pytest.param(quickstart.get_config, id='quickstart'),
    pytest.param(
      lambda: quickstart_bpe.get_config('smoke'), id='quickstart_bpe_smoke'
    ),
  ],
)
def test_text_corpus_batches_match_the_token_array_pipeline(config, tmp_path):
  c = config()
  settings = builders.data_settings(c.data)
  data = builders.prepare_data(settings, str(tmp_path))
  tok, splits = _reference_splits(settings)
  assert data.tokenizer == tok
  assert sorted(data.splits) == sorted(splits)
  got = builders.train_batches(c, data, c.seed)
  want = pipeline.train_iterator(
    splits['train'],
    seq_len=c.data.seq_len,
    batch_size=c.train.batch_size,
    seed=c.seed,
  )
  for _ in range(4):
    g, w = next(got), next(want)
    assert list(g) == ['tokens']
    assert g['tokens'].dtype == w['tokens'].dtype == np.int32
    np.testing.assert_array_equal(g['tokens'], w['tokens'])
  assert got.get_state() == want.get_state()  # Checkpoints resume alike.
  ev = data.eval_batches(
    'validation', seq_len=c.data.seq_len, batch_size=c.eval.batch_size
  )
  ref = pipeline.eval_batches(
    splits['validation'],
    seq_len=c.data.seq_len,
    batch_size=c.eval.batch_size,
  )
  assert len(ev) == len(ref) > 0
  for g, w in zip(ev, ref):
    np.testing.assert_array_equal(g['tokens'], w)
  # A resumed run reuses the saved tokenizer and sees the same stream.
  again = builders.prepare_data(settings, str(tmp_path))
  np.testing.assert_array_equal(again.splits['train'], splits['train'])


def test_text_corpus_too_short_for_a_row_says_so(tmp_path):
  for name, text in (('train', 'abcdefgh' * 40), ('validation', 'abcdefg')):
    (tmp_path / f'{name}.txt').write_text(text)
  files = TextFiles(
    train=str(tmp_path / 'train.txt'),
    validation=str(tmp_path / 'validation.txt'),
  )
  data = builders.prepare_data(
    DataConfig(corpus='text_files', files=files, seq_len=16), None
  )
  with pytest.raises(ValueError, match='seq_len 16 exceeds the validation'):
    data.eval_batches('validation', seq_len=16, batch_size=1)


def test_data_settings_defaults_are_the_base_config_block():
  block = common.base_config().data
  assert builders.data_settings(block) == DataConfig()
  assert builders.data_settings(block.to_dict()).files == TextFiles()


def test_data_settings_refuse_a_misspelt_key_naming_the_closest():
  block = common.base_config().data.to_dict()
  block['seq_lne'] = 64
  with pytest.raises(ConfigError, match=r'data\.seq_lne .*data\.seq_len\?'):
    builders.data_settings(block)
  block = common.base_config().data.to_dict()
  block['files']['tran'] = 'x.txt'
  with pytest.raises(ConfigError, match=r'files\.tran is not a split'):
    builders.data_settings(block)


def test_data_settings_of_an_older_run_take_defaults_for_new_keys():
  block = common.base_config().data.to_dict()
  for key in ('num_threads', 'owt_validation_fraction', 'hf_dataset'):
    del block[key]
  block['seq_len'] = 64
  got = builders.data_settings(block)
  assert got == dataclasses.replace(DataConfig(), seq_len=64)


def test_source_registry_takes_typed_settings_only():
  with pytest.raises(TypeError, match='DataConfig'):
    source_registry.build_source(common.base_config().data)
  with pytest.raises(ValueError, match="did you mean 'shakespeare'"):
    source_registry.build_source(DataConfig(corpus='shakespear'))
  assert set(source_registry.BUILDERS) == {
    *source_registry.TEXT_CORPORA,
    *source_registry.CORPORA,
    *source_registry.PAIR_SETS,
  }


@pytest.mark.parametrize(
  'key,value,message',
  [
    ('wrap', 'bos', "data.wrap='bos'; choose one of"),
    ('packing', 'pad', "data.packing='pad'; choose one of"),
    ('owt_split', 'md5', "data.owt_split='md5'; choose one of"),
    ('seq_len', 0, 'data.seq_len=0 must be an integer >= 1'),
    ('num_threads', 1.5, 'data.num_threads=1.5 must be an integer'),
  ],
)
def test_data_settings_refuse_values_out_of_range_before_any_read(
  key, value, message
):
  block = common.base_config().data.to_dict()
  block[key] = value
  with pytest.raises(ConfigError, match=re.escape(message)):
    builders.data_settings(block)


def test_a_workdir_saved_with_an_older_data_block_still_loads(tmp_path):
  from ddlm_jax.tasks.language_model import load_config

  saved = quickstart.get_config('smoke').to_dict()
  saved['mesh']['shape'] = list(saved['mesh']['shape'])
  del saved['data']['num_threads'], saved['data']['owt_validation_fraction']
  saved['data']['batch_size'] = saved['train'].pop('batch_size')  # Old name.
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  config = load_config(str(tmp_path))
  got = builders.data_settings(config.data)
  assert got.num_threads == 1 and got.seq_len == saved['data']['seq_len']
  assert config.train.batch_size == saved['data']['batch_size']
