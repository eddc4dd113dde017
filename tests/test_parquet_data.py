"""OpenWebText and the zero-shot sets through Parquet: no dataset scripts."""

import importlib
import os

import numpy as np
import pytest

datasets = pytest.importorskip('datasets', reason='the data extra')
pq = pytest.importorskip('pyarrow.parquet', reason='the data extra')

from ddlm_jax.data import openwebtext, parquet  # noqa: E402
from ddlm_jax.data import zero_shot as zs_data  # noqa: E402
from ddlm_jax.training import builders  # noqa: E402
from experiments.configs.common import FIXTURES  # noqa: E402


def _config(**data):
  c = importlib.import_module('experiments.configs.mdlm_owt').get_config(
    'smoke'
  )
  for key, value in data.items():
    c.data[key] = value
  return builders.data_settings(c.data)


def _as_parquet(ds, folder, shards: int, prefix='plain_text/train'):
  """`ds` as the Hub's Parquet conversion lays it out: NNNN.parquet shards."""
  bounds = np.linspace(0, len(ds), shards + 1).astype(int)
  for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
    path = folder / prefix / f'{i:04d}.parquet'
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(ds.select(range(a, b)).data.table, path)
  return folder


def test_parquet_files_are_read_in_document_order(tmp_path):
  ds = datasets.load_from_disk(str(FIXTURES / 'openwebtext'))
  # 12 shards: 0010 sorts after 0009 (and 0002) by name, as on the Hub.
  folder = _as_parquet(ds, tmp_path / 'owt', 12)
  files = parquet.parquet_files(str(folder))
  assert [os.path.basename(f) for f in files][-3:] == [
    '0009.parquet',
    '0010.parquet',
    '0011.parquet',
  ]
  got = openwebtext.owt_records(_config(data_dir=str(folder)))
  assert got['text'] == ds['text']


def test_the_document_split_is_the_same_from_parquet(tmp_path):
  """mdlm and md4 splits select the same tokens as the save_to_disk copy."""
  ds = datasets.load_from_disk(str(FIXTURES / 'openwebtext'))
  folder = _as_parquet(ds, tmp_path / 'owt', 5)
  for owt_split in openwebtext.OWT_SPLITS:
    streams = []
    for data_dir in (str(FIXTURES / 'openwebtext'), str(folder)):
      cfg = _config(
        data_dir=data_dir,
        cache_dir=str(tmp_path / f'cache_{len(streams)}'),
        owt_split=owt_split,
      )
      src = openwebtext.openwebtext_source(cfg)
      streams.append(
        [
          src.eval_batches(split, seq_len=32, batch_size=2)[0]['tokens']
          for split in ('train', 'validation')
        ]
      )
    for a, b in zip(*streams):
      np.testing.assert_array_equal(a, b)


def test_the_hub_route_asks_for_parquet_only(monkeypatch):
  asked = []

  def fake_load(path, *args, **kwargs):
    asked.append((path, kwargs.get('data_files')))
    if len(asked) == 1:
      raise FileNotFoundError('no parquet on main')
    return datasets.Dataset.from_dict({'text': ['a', 'b']})

  monkeypatch.setattr(datasets, 'load_dataset', fake_load)
  got = openwebtext.owt_records(_config(data_dir='', hf_dataset='me/owt'))
  assert got['text'] == ['a', 'b']
  assert [path for path, _ in asked] == ['parquet', 'parquet']
  assert asked[0][1] == {'train': 'hf://datasets/me/owt/**/*.parquet'}
  assert asked[1][1] == {
    'train': 'hf://datasets/me/owt@refs%2Fconvert%2Fparquet/plain_text/*/'
    '*.parquet'
  }


def test_a_partial_conversion_of_owt_is_refused(monkeypatch):
  monkeypatch.setattr(
    datasets,
    'load_dataset',
    lambda *a, **k: datasets.Dataset.from_dict({'text': ['a'] * 3}),
  )
  cfg = _config(data_dir='', hf_dataset='Skylion007/openwebtext')
  with pytest.raises(openwebtext.DataUnavailableError, match='partial'):
    openwebtext.owt_records(cfg)


def test_split_files_pick_one_split(tmp_path):
  names = [
    'cfg/test/0000.parquet',
    'cfg/validation/0000.parquet',
    'cfg/validation/0001.parquet',
    'cfg/partial-train/0000.parquet',
  ]
  files = [str(tmp_path / n) for n in names]
  pick = lambda split: [  # noqa: E731
    os.path.relpath(f, tmp_path)
    for f in parquet.split_files(files, str(tmp_path), split)
  ]
  assert pick('validation') == names[1:3]
  assert pick('train') == names[3:]
  own = [str(tmp_path / n) for n in ('validation-0.parquet', 'test-0.parquet')]
  assert parquet.split_files(own, str(tmp_path), 'test') == own[1:]
  plain = [str(tmp_path / 'data-00000-of-00001.parquet')]
  assert parquet.split_files(plain, str(tmp_path), 'test') == plain


def test_zero_shot_sets_load_from_a_parquet_folder(tmp_path):
  """The Hub conversion's layout: <config>/<split>/NNNN.parquet per set."""
  from ddlm_jax.data import detokenizers

  lines = [' = Title = \n', ' some text @-@ here \n', '']
  val = datasets.Dataset.from_dict({'text': lines})
  test = datasets.Dataset.from_dict({'text': ['other split']})
  root = tmp_path / 'zs' / 'wikitext2'
  _as_parquet(val, root, 2, 'wikitext-2-raw-v1/validation')
  _as_parquet(test, root, 1, 'wikitext-2-raw-v1/test')
  docs = zs_data.load_zero_shot('wikitext2', data_dir=str(tmp_path / 'zs'))
  assert docs.get_many(range(len(docs))) == [
    detokenizers.wikitext(t) for t in lines
  ]
  test_docs = zs_data.load_zero_shot(
    'wikitext2', data_dir=str(tmp_path / 'zs'), split='test'
  )
  assert len(test_docs) == 1


def test_a_script_dataset_falls_back_to_its_parquet_conversion(monkeypatch):
  asked = []

  def fake_load(path, *args, **kwargs):
    asked.append((path, kwargs.get('data_files')))
    if path != 'parquet':
      raise RuntimeError('Dataset scripts are no longer supported')
    if '%2F' not in kwargs['data_files']['validation']:
      raise FileNotFoundError('no own Parquet files')
    return datasets.Dataset.from_dict({'sentence': ['a <unk> b']})

  monkeypatch.setattr(datasets, 'load_dataset', fake_load)
  docs = zs_data.load_zero_shot('ptb', detokenize=False)
  assert docs[0] == 'a <unk> b'
  assert asked[0][0] == 'ptb_text_only'
  assert asked[1][1] == {
    'validation': 'hf://datasets/ptb_text_only/penn_treebank/'
    'validation-*.parquet'
  }
  assert asked[2][1] == {
    'validation': 'hf://datasets/ptb_text_only@refs%2Fconvert%2Fparquet/'
    'penn_treebank/*validation/*.parquet'
  }


def test_the_save_commands_download_parquet_not_scripts():
  spec = zs_data.get_dataset('ag_news')
  cmd = zs_data.save_command(spec, 'test', '')
  assert cmd.startswith('python -m ddlm_jax.data.zero_shot --names=ag_news')
  assert 'datasets<4' not in cmd
  assert '--save_to=' in openwebtext.save_command('Skylion007/openwebtext')
