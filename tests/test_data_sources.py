"""Dataset sources: text8, LM1B (TFDS ArrayRecord), OpenWebText (HF), configs.

Everything runs offline on data made here or shipped under tests/fixtures/
(real formats: a text8 zip, a TFDS lm1b ArrayRecord dir, an HF save_to_disk
folder), through the same code paths as the full datasets.
"""

import dataclasses
import importlib
import json
import os
import zipfile

import numpy as np
import pytest

from ddlm_jax.data import (
  lm1b,
  openwebtext,
  pipeline,
  pretrained,
  source_registry,
  sources,
  tokenizers,
)
from ddlm_jax.data import text8 as text8_lib
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.training import builders
from experiments.configs.common import FIXTURES

PAPER_CONFIGS = (
  'md4_text8',
  'md4_owt',
  'mdlm_lm1b',
  'mdlm_owt',
  'ar_owt',
  'ar_lm1b',
)
PAPER_NUMBERS = {
  'md4_text8': '1.37',
  'md4_owt': '22.13',
  'mdlm_lm1b': '27.04',
  'mdlm_owt': '23.21',
  'ar_owt': '23.21',
  'ar_lm1b': '27.04',
}


def _take(it, n):
  return [next(it) for _ in range(n)]


def _config(name, preset='smoke', **data):
  c = importlib.import_module(f'experiments.configs.{name}').get_config(preset)
  for key, value in data.items():
    c.data[key] = value
  return c


def _settings(name, preset='smoke', **data):
  """The typed data settings of a config, with `data` overrides."""
  return builders.data_settings(_config(name, preset, **data).data)


# ---------------------------------------------------------------- text8


def _write_text8(folder, text: str):
  folder.mkdir(parents=True, exist_ok=True)
  with zipfile.ZipFile(folder / 'text8.zip', 'w') as z:
    z.writestr('text8', text.encode('ascii'))
  return folder


def _offline(monkeypatch):
  """HF offline mode (the env vars are read at import, so patch both)."""
  import datasets
  import huggingface_hub.constants

  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', True)
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)


def test_text8_standard_split_and_tokenizer():
  assert text8_lib.split_bounds(100_000_000) == (90_000_000, 95_000_000)
  tok = text8_lib.Text8Tokenizer()
  assert tok.vocab_size == 27
  np.testing.assert_array_equal(tok.encode('az '), [0, 25, 26])
  assert tok.decode([7, 8, 26, 27]) == 'hi _'  # 27 = a diffusion mask id.
  with pytest.raises(ValueError, match='offset 1'):
    tok.encode_bytes(b'aB')


def test_text8_zip_reads_and_splits_by_position(tmp_path):
  rng = np.random.default_rng(0)
  text = ''.join(rng.choice(list(text8_lib.ALPHABET), 2000))
  _write_text8(tmp_path, text)
  ids = text8_lib.read_text8(str(tmp_path))
  assert ids.dtype == np.uint8 and ids.size == 2000
  splits = text8_lib.text8_splits(ids)
  assert [v.size for v in splits.values()] == [1800, 100, 100]
  tok = text8_lib.Text8Tokenizer()
  assert tok.decode(splits['validation']) == text[1800:1900]
  assert tok.decode(np.concatenate(list(splits.values()))) == text


def test_text8_missing_or_wrong_archive_is_explained(tmp_path):
  with pytest.raises(pretrained.DataUnavailableError) as e:
    text8_lib.read_text8(str(tmp_path / 'nowhere'))
  assert 'wget' in str(e.value) and text8_lib.URL in str(e.value)
  with zipfile.ZipFile(tmp_path / 'text8.zip', 'w') as z:
    z.writestr('other', b'abc')
  with pytest.raises(ValueError, match="no member 'text8'"):
    text8_lib.read_text8(str(tmp_path))


# ------------------------------------------------------- packed pipeline


def test_packed_split_batches_equal_the_array_path_on_any_dtype():
  stream = (np.arange(1000) % 27).astype(np.int32)
  for shard in range(2):
    kw = dict(seq_len=10, batch_size=4, seed=5, shard_count=2)
    want = pipeline.train_dataset(stream, shard_index=shard, **kw)
    got = pipeline.train_dataset(
      sources.PackedSplit(stream.astype(np.uint8)), shard_index=shard, **kw
    )
    for i in range(40):  # Several epochs: offsets and shuffles move.
      np.testing.assert_array_equal(got[i]['tokens'], want[i]['tokens'])
      assert got[i]['tokens'].dtype == np.int32


def test_packed_rows_are_framed_and_eval_is_in_order():
  stream = np.arange(200, dtype=np.uint16)
  split = sources.PackedSplit(stream, bos=900, eos=901)
  ds = pipeline.train_dataset(split, seq_len=10, batch_size=3, seed=1)
  x = ds[0]['tokens']
  assert (x[:, 0] == 900).all() and (x[:, -1] == 901).all()
  body = x[:, 1:-1]
  assert (np.diff(body, axis=1) == 1).all()  # Contiguous stream pieces.
  evals = sources.packed_eval_batches(split, seq_len=10, batch_size=4)
  assert len(evals) == 6  # 25 rows of 8 -> 6 full batches of 4.
  np.testing.assert_array_equal(evals[0]['tokens'][1, 1:-1], np.arange(8, 16))
  last = sources.packed_eval_batches(
    split, seq_len=10, batch_size=4, drop_partial=False
  )
  assert len(last) == 7 and last[-1]['tokens'].shape == (1, 10)


def test_md4_row_split_is_disjoint_seeded_and_used_by_training():
  train, val = openwebtext.md4_window_split(1000, 0.02)
  assert len(val) == 20 and len(train) == 980
  assert not set(train) & set(val)
  again = openwebtext.md4_window_split(1000, 0.02)
  np.testing.assert_array_equal(val, again[1])
  stream = np.arange(1000 * 8, dtype=np.int32)
  split = sources.PackedSplit(stream, window_ids=val, grid_len=8)
  ds = pipeline.train_dataset(split, seq_len=8, batch_size=5, seed=0)
  starts = {int(r[0]) // 8 for i in range(8) for r in ds[i]['tokens']}
  assert starts == set(val.tolist())  # Only held-out rows, offset 0.
  with pytest.raises(ValueError, match='rows of length 8'):
    split.inner_len(16)
  src = sources.Source('toy', None, {'validation': lambda: split})
  joined = src.split_tokens('validation')  # What data.splits[...] gives.
  np.testing.assert_array_equal(
    pipeline.eval_batches(joined, seq_len=8, batch_size=20)[0],
    sources.packed_eval_batches(split, seq_len=8, batch_size=20)[0]['tokens'],
  )


def test_source_iterator_resumes_exactly():
  src = sources.Source(
    'toy',
    text8_lib.Text8Tokenizer(),
    {'train': lambda: sources.PackedSplit(np.arange(500) % 27)},
  )
  kw = dict(seq_len=7, batch_size=3, seed=2)
  ref = _take(src.train_iterator(**kw), 30)
  it = src.train_iterator(**kw)
  _take(it, 11)
  state = json.loads(json.dumps(it.get_state()))
  resumed = src.train_iterator(**kw)
  resumed.set_state(state)
  for got, want in zip(_take(resumed, 19), ref[11:]):
    np.testing.assert_array_equal(got['tokens'], want['tokens'])


# ------------------------------------------------------- padded documents


def test_pad_documents_truncates_frames_and_masks():
  split = sources.DocumentSplit(['unused'], bos=30, eos=31, pad=29)
  out = sources.pad_documents([np.arange(3), np.arange(10)], split, 6)
  np.testing.assert_array_equal(
    out['tokens'], [[30, 0, 1, 2, 31, 29], [30, 0, 1, 2, 3, 31]]
  )
  np.testing.assert_array_equal(
    out['loss_mask'], [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
  )
  assert out['loss_mask'].dtype == np.float32


def test_padded_epoch_covers_documents_once_across_shards():
  docs = [chr(ord('a') + i % 26) * (1 + i % 5) for i in range(24)]
  split = sources.DocumentSplit(docs, bos=27, eos=28, pad=29)
  tok = text8_lib.Text8Tokenizer()
  seen = []
  for shard in range(2):
    ds = sources.padded_train_dataset(
      split,
      tok,
      seq_len=8,
      batch_size=4,
      seed=3,
      shard_index=shard,
      shard_count=2,
    )
    for i in range(3):  # 24 docs / (2 x 4) = 3 batches per epoch.
      b = ds[i]
      for row, mask in zip(b['tokens'], b['loss_mask']):
        n = int(mask.sum())
        seen.append(tok.decode(row[1 : n - 1]))
  assert sorted(seen) == sorted(docs)


# ------------------------------------------------------- token caches


def test_cached_stream_builds_once_and_refuses_other_inputs(tmp_path):
  calls = []

  def build():
    calls.append(1)
    yield np.arange(5)
    yield np.arange(3)

  meta = {'tokenizer': 'abc'}
  kw = dict(dtype=np.dtype(np.uint16))
  a = sources.cached_stream(tmp_path, 's', meta, build, **kw)
  b = sources.cached_stream(tmp_path, 's', meta, build, **kw)
  assert len(calls) == 1 and isinstance(b, np.memmap)
  np.testing.assert_array_equal(b, [0, 1, 2, 3, 4, 0, 1, 2])
  assert a.dtype == np.uint16
  with pytest.raises(ValueError, match='tokenizer'):
    sources.cached_stream(tmp_path, 's', {'tokenizer': 'xyz'}, build, **kw)

  def broken():
    yield np.arange(3)
    raise RuntimeError('interrupted')

  with pytest.raises(RuntimeError):
    sources.cached_stream(tmp_path, 't', meta, broken, **kw)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['s.bin', 's.json']


# ------------------------------------------------------- tokenizers


def test_hf_tokenizer_from_path_specials_and_offline_error(
  tmp_path, monkeypatch
):
  texts = ['the cat sat on the mat', 'a dog ran'] * 20
  wp = pretrained.build_test_tokenizer('test:wordpiece', texts, 100)
  assert wp.special_ids == pretrained.SpecialIds(bos=2, eos=3, pad=0)
  bpe = pretrained.build_test_tokenizer('test:bytebpe', texts, 300)
  assert bpe.special_ids == pretrained.SpecialIds(bos=0, eos=0, pad=0)
  wp._hf.save(str(tmp_path / 'tokenizer.json'))
  again = pretrained.load_hf_tokenizer(str(tmp_path))
  np.testing.assert_array_equal(again.encode('the cat'), wp.encode('the cat'))
  ids = again.encode_batch(['a dog', 'the mat'])
  assert [x.tolist() for x in ids] == [
    wp.encode('a dog').tolist(),
    wp.encode('the mat').tolist(),
  ]
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  with pytest.raises(pretrained.DataUnavailableError, match='hf_hub_download'):
    pretrained.load_hf_tokenizer('no-such-org/no-such-tokenizer')


def test_load_tokenizer_round_trips_every_saved_kind(tmp_path):
  texts = ['the cat sat on the mat', 'a dog ran'] * 20
  kinds = {
    'char': tokenizers.CharTokenizer.from_text('abc the cat'),
    'byte': tokenizers.ByteTokenizer(),
    'bpe': tokenizers.BPETokenizer.train('\n'.join(texts), 270),
    'wordpiece': pretrained.build_test_tokenizer('test:wordpiece', texts, 100),
    'bytebpe': pretrained.build_test_tokenizer('test:bytebpe', texts, 300),
    'text8': text8_lib.Text8Tokenizer(),
  }
  for name, tok in kinds.items():
    tok.save(tmp_path / name)
    again = tokenizers.load_tokenizer(tmp_path / name)
    assert type(again) is type(tok) and again == tok, name
    want = [tok.encode(t).tolist() for t in texts[:2]]
    assert [x.tolist() for x in again.encode_batch(texts[:2])] == want
    if isinstance(tok, tokenizers.BPETokenizer):
      assert again.special_ids == tok.special_ids, name
  assert tokenizers.load_tokenizer(tmp_path / 'wordpiece').special_ids.pad == 0
  with pytest.raises(ValueError, match='subword'):
    lm1b.lm1b_source(
      _settings('mdlm_lm1b'), tokenizers.load_tokenizer(tmp_path / 'char')
    )


def test_source_registry_builds_each_corpus_and_rejects_others():
  assert source_registry.CORPORA == ('text8', 'lm1b', 'openwebtext')
  src = source_registry.build_source(_settings('md4_text8'))
  assert src.name == 'text8' and src.tokenizer.vocab_size == 27
  with pytest.raises(ValueError, match='not a source'):
    source_registry.build_source(_settings('md4_text8', corpus='shakespear'))


# ------------------------------------------------------- LM1B


def _statmt_tree(root, train, test):
  top = root / '1-billion-word-language-modeling-benchmark-r13output'
  tr = top / 'training-monolingual.tokenized.shuffled'
  te = top / 'heldout-monolingual.tokenized.shuffled'
  tr.mkdir(parents=True)
  te.mkdir(parents=True)
  (tr / 'news.en-00001-of-00100').write_text('\n'.join(train) + '\n')
  (te / 'news.en.heldout-00000-of-00050').write_text('\n'.join(test) + '\n')


def test_lm1b_tfds_builder_runs_without_tensorflow(tmp_path):
  train = [f'sentence number {i} , here .' for i in range(30)]
  test = ['a held out line .', 'another one !']
  _statmt_tree(tmp_path / 'raw', train, test)
  lm1b.build_lm1b(str(tmp_path / 'tfds'), extracted_dir=str(tmp_path / 'raw'))
  import tensorflow_datasets as tfds

  # TFDS's own lm1b builder stays the registered one.
  assert tfds.builder_cls('lm1b') is not lm1b.builder_class()
  with pytest.raises(pretrained.DataUnavailableError, match='r13output'):
    lm1b.build_lm1b(str(tmp_path / 'tfds2'), extracted_dir=str(tmp_path))
  docs = lm1b.lm1b_documents('train', str(tmp_path / 'tfds'))
  assert sorted(docs.get_many(range(len(docs)))) == sorted(train)
  val = lm1b.lm1b_documents('validation', str(tmp_path / 'tfds'), True)
  assert sorted(val) == ['a held out line.', 'another one!']


def test_lm1b_mock_data_padded_and_packed(tmp_path):
  import tensorflow_datasets as tfds

  cfg = _settings('mdlm_lm1b', cache_dir=str(tmp_path))
  with tfds.testing.mock_data(
    num_examples=64, policy=tfds.testing.MockPolicy.USE_CODE
  ):
    padded = lm1b.lm1b_source(cfg)
    b = next(padded.train_iterator(seq_len=16, batch_size=4, seed=0))
    cls, sep = (
      padded.tokenizer.special_ids.bos,
      padded.tokenizer.special_ids.eos,
    )
    assert (b['tokens'][:, 0] == cls).all()
    n = b['loss_mask'].sum(1).astype(int)
    assert (b['tokens'][np.arange(4), n - 1] == sep).all()
    cfg = dataclasses.replace(cfg, packing='packed')
    packed = lm1b.lm1b_source(cfg, padded.tokenizer)
    rows = packed.eval_batches('validation', seq_len=16, batch_size=2)
    assert (rows[0]['tokens'][:, 0] == cls).all()
    assert 'loss_mask' not in rows[0]


def test_lm1b_absent_names_both_build_commands(tmp_path):
  with pytest.raises(pretrained.DataUnavailableError) as e:
    lm1b.lm1b_documents('train', str(tmp_path))
  msg = str(e.value)
  assert 'tfds build lm1b --file_format=array_record' in msg
  assert 'python -m ddlm_jax.data.lm1b' in msg


# ------------------------------------------------------- OpenWebText


def test_openwebtext_mdlm_split_holds_out_the_last_documents(tmp_path):
  import datasets

  docs = [f'document {i} says {"word " * (i % 7)}end.' for i in range(60)]
  datasets.Dataset.from_dict({'text': docs}).save_to_disk(tmp_path / 'owt')
  cfg = _settings(
    'mdlm_owt',
    data_dir=str(tmp_path / 'owt'),
    cache_dir=str(tmp_path / 'cache'),
    owt_validation_docs=10,
  )
  src = openwebtext.openwebtext_source(cfg)
  tok, eos = src.tokenizer, src.tokenizer.special_ids.eos
  want = np.concatenate([np.append(tok.encode(d), eos) for d in docs[-10:]])
  np.testing.assert_array_equal(src.split('validation').tokens, want)
  train_text = tok.decode(src.split('train').tokens)
  assert 'document 49 ' in train_text and 'document 50 ' not in train_text
  row = src.eval_batches('validation', seq_len=32, batch_size=2)[0]['tokens']
  np.testing.assert_array_equal(row[0, 1:-1], want[:30])
  assert row[0, 0] == row[0, -1] == eos  # GPT-2 style: BOS = EOS.


def test_openwebtext_absent_is_explained(tmp_path, monkeypatch):
  cfg = _settings('mdlm_owt', data_dir=str(tmp_path / 'none'))
  with pytest.raises(pretrained.DataUnavailableError, match='--save_to='):
    openwebtext.owt_records(cfg)
  _offline(monkeypatch)
  cfg = dataclasses.replace(
    cfg, data_dir='', hf_dataset='no-such-org/no-such-dataset'
  )
  with pytest.raises(pretrained.DataUnavailableError, match='save it once'):
    openwebtext.owt_records(cfg)


# ------------------------------------------------------- paper configs


@pytest.mark.parametrize('name', PAPER_CONFIGS)
def test_paper_config_documents_its_recipe(name):
  module = importlib.import_module(f'experiments.configs.{name}')
  doc = module.__doc__
  assert PAPER_NUMBERS[name] in doc
  assert f'--config=experiments/configs/{name}.py' in doc
  assert 'Sized for' in doc and 'steps' in doc
  full = module.get_config()
  assert full.train.num_steps == 1_000_000
  assert full.train.batch_size == 512
  assert full.data.seq_len == {'text8': 256, 'lm1b': 128}.get(
    full.data.corpus, 1024
  )
  with pytest.raises(ValueError, match='preset'):
    module.get_config('tiny')


@pytest.mark.parametrize('name', PAPER_CONFIGS)
def test_paper_smoke_presets_build_data_and_model(name, tmp_path):
  c = _config(name, cache_dir=str(tmp_path / 'cache'))
  assert c.data.data_dir.startswith(str(FIXTURES))
  data = builders.prepare_data(
    builders.data_settings(c.data), str(tmp_path / 'run')
  )
  batch = next(builders.train_batches(c, data, c.seed))
  assert batch['tokens'].shape == (c.train.batch_size, c.data.seq_len)
  assert ('loss_mask' in batch) == (c.data.packing == 'padded')
  assert batch['tokens'].max() < data.tokenizer.vocab_size
  ev = data.eval_batches(
    'validation', seq_len=c.data.seq_len, batch_size=c.eval.batch_size
  )
  assert len(ev) >= c.eval.final_num_batches
  process = builders.make_process(
    builders.process_settings(c.process), data.tokenizer.vocab_size
  )
  builders.model_config(c.model, process)
  reloaded = tokenizers.load_tokenizer(tmp_path / 'run' / 'tokenizer')
  assert reloaded == data.tokenizer
  if c.data.corpus == 'text8':
    assert data.tokenizer.vocab_size == 27


def test_saved_tokenizer_lets_a_run_start_without_its_data(tmp_path):
  c = _config('mdlm_owt', cache_dir=str(tmp_path / 'cache'))
  first = builders.prepare_data(builders.data_settings(c.data), str(tmp_path))
  c.data.data_dir = str(tmp_path / 'moved-away')
  moved = builders.data_settings(c.data)
  again = builders.prepare_data(moved, str(tmp_path))  # Reads no data.
  assert again.tokenizer == first.tokenizer
  assert 'validation' in again.splits and 'test' not in again.splits
  with pytest.raises(pretrained.DataUnavailableError):
    again.eval_batches('validation', seq_len=32, batch_size=2)


def test_data_eval_batches_keep_the_embedded_corpus_path():
  stream = np.arange(300, dtype=np.int32)
  source = sources.Source(
    'text', None, {'validation': lambda: pipeline.PackedSplit(stream)}
  )
  data = builders.Data(tokenizer=None, source=source)
  got = data.eval_batches('validation', seq_len=10, batch_size=4)
  want = pipeline.eval_batches(stream, seq_len=10, batch_size=4)
  assert len(got) == len(want) == 7
  for g, w in zip(got, want):
    assert list(g) == ['tokens']
    np.testing.assert_array_equal(g['tokens'], w)
  with pytest.raises(ValueError, match="split 'test'"):
    data.eval_batches('test', seq_len=10, batch_size=4)


@pytest.mark.slow
def test_md4_text8_smoke_trains_end_to_end(tmp_path):
  c = _config('md4_text8')
  c.mesh.shape = (1, 1, 1)
  c.sample.num_samples = 0
  summary = lm.train_and_evaluate(c, str(tmp_path))
  assert summary['steps'] == c.train.num_steps
  bpc = summary['validation']['bits_per_token']
  # Trained a few steps from ~log2(27) = 4.75: finite and a sane bound.
  assert np.isfinite(bpc) and 1.0 < bpc < 8.0
  saved = json.loads((tmp_path / 'config.json').read_text())
  assert saved['data']['corpus'] == 'text8'
  assert os.path.exists(tmp_path / 'tokenizer' / 'ddlm_tokenizer.json')


@pytest.mark.slow
@pytest.mark.parametrize(
  'name,preset',
  [
    ('md4_owt', 'smoke'),
    ('mdlm_lm1b', 'smoke'),
    ('ar_lm1b', 'smoke'),
    ('ar_owt', 'smoke'),
    # Uniform-state with Duo's curriculum on padded LM1B rows (loss_mask),
    # and block diffusion on packed OWT rows.
    ('duo_lm1b', 'smoke'),
    ('bd3_owt', '16,smoke'),
  ],
)
def test_paper_smoke_presets_train_end_to_end(name, preset, tmp_path):
  """Every paper config's :smoke preset trains and evaluates through the
  real data code (md4_text8 and mdlm_owt have their own tests)."""
  c = _config(name, preset, cache_dir=str(tmp_path / 'cache'))
  c.mesh.shape = (1, 1, 1)
  c.sample.num_samples = 0
  summary = lm.train_and_evaluate(c, str(tmp_path / 'run'))
  assert summary['steps'] == c.train.num_steps
  assert np.isfinite(summary['validation']['nats_per_token'])
  assert summary['validation']['num_tokens'] > 0
