"""Token-cache preparation in worker processes, and its benchmark script.

The caches must not depend on the process count: the same bytes for
``num_proc`` 1 and 2, compared exactly. The benchmark runs end to end on a
corpus just over two blocks of documents (so the worker pool is used),
through the real OpenWebText and LM1B preparation code.
"""

import importlib
import json

import numpy as np
import pytest

from ddlm_jax.data import detokenizers, lm1b, openwebtext, sources
from ddlm_jax.data.pretrained import build_test_tokenizer
from ddlm_jax.data.settings import DataConfig
from experiments.benchmarks import data_prep

WORDS = 'the a of to in zebra quantum lattice , . river stone'.split()


def _docs(n: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  return [
    ' '.join(rng.choice(WORDS, size=int(rng.integers(1, 30)))) for _ in range(n)
  ]


@pytest.fixture(scope='module')
def bpe():
  return build_test_tokenizer('test:bytebpe', _docs(200, seed=1), 300)


def _stream(docs, tok, eos, num_proc):
  pieces = list(
    sources.document_stream(docs, tok, eos, block=16, num_proc=num_proc)
  )
  return pieces


def test_worker_processes_give_the_same_stream(bpe):
  """Over the record source the preparation reads (an Arrow table, with
  LM1B's detokenizer), which the workers receive pickled."""
  import datasets

  texts = _docs(70)  # Five blocks of 16, the last one short.
  table = datasets.Dataset.from_dict({'text': texts})
  docs = sources.TextColumn(table, 'text', detokenizer=detokenizers.lm1b)
  eos = bpe.special_ids.eos
  one = _stream(docs, bpe, eos, 1)
  two = _stream(docs, bpe, eos, 2)
  assert len(one) == len(two) == 5
  for a, b in zip(one, two):
    assert a.dtype == b.dtype == np.uint16
    np.testing.assert_array_equal(a, b)
  # Against a direct encoding: documents in order, each followed by EOS.
  want = np.concatenate(
    [np.append(bpe.encode(detokenizers.lm1b(t)), eos) for t in texts]
  )
  np.testing.assert_array_equal(np.concatenate(two), want)


def test_bad_process_counts_are_refused_before_work(bpe):
  for bad in (0, -2, 1.5, True):
    with pytest.raises(ValueError, match='num_proc'):
      list(sources.document_stream(['x'], bpe, None, num_proc=bad))

  for bad in (0, '2', False):
    with pytest.raises(ValueError, match='data.prep_processes'):
      DataConfig(prep_processes=bad)
  old = DataConfig.from_dict({'corpus': 'openwebtext'})  # Saved before it.
  assert sources.prep_processes(old) == 1
  assert sources.prep_processes(DataConfig(prep_processes=4)) == 4
  # The sources refuse it when built, before reading anything (the data
  # folder does not exist).
  for corpus, build in (
    ('mdlm_owt', openwebtext.openwebtext_source),
    ('mdlm_lm1b', lm1b.lm1b_source),
  ):
    cfg = importlib.import_module(f'experiments.configs.{corpus}').get_config()
    cfg.data.prep_processes = 0
    cfg.data.data_dir = '/nonexistent/ddlm_data'
    with pytest.raises(ValueError, match='data.prep_processes=0'):
      build(DataConfig.from_dict(cfg.data), bpe)


def test_synthetic_corpus_has_the_asked_length_distribution():
  rng = np.random.default_rng(0)
  n = data_prep.lognormal_lengths(rng, 20_000, 27.0, 0.5)
  assert abs(n.mean() - 27.0) < 0.5  # Mean, not median, is the target.
  assert np.median(n) < n.mean()  # A right tail, as real corpora have.
  words, p = data_prep.lexicon(0)
  assert len(words) == len(p) and abs(p.sum() - 1) < 1e-9
  assert p[0] > 100 * p[-1]  # Zipf: a few words dominate.


def _bench(tmp_path, monkeypatch, docs: int, num_proc: str):
  import datasets

  # The Parquet loader's Arrow copies go under tmp_path, not the user's cache.
  monkeypatch.setattr(
    datasets.config, 'HF_DATASETS_CACHE', str(tmp_path / 'hf')
  )
  out, record_dir = tmp_path / 'work', tmp_path / 'records'
  record = data_prep.main(
    [
      f'--out={out}',
      f'--owt_docs={docs}',
      '--owt_mean_chars=120',
      f'--lm1b_sentences={docs}',
      f'--num_proc={num_proc}',
      '--tokenizer_vocab=400',
      '--tokenizer_docs=200',
      f'--record={record_dir}',
      '--in_process',
    ]
  )
  return out, record_dir, record


def _check_rows(record, docs: int, procs):
  rows = {(r['phase'], r['num_proc']): r for r in record['phases']}
  want = {('lm1b_build', 1)} | {
    (phase, n) for phase in ('owt', 'lm1b') for n in procs
  }
  assert set(rows) == want
  for (phase, _), row in rows.items():
    assert row['documents'] == docs and row['documents_per_s'] > 0
    real = row['extrapolated']
    assert real['real_documents'] == (
      data_prep.OWT_REAL_DOCS
      if phase == 'owt'
      else data_prep.LM1B_REAL_SENTENCES
    )
    assert np.isclose(
      real['hours'], real['real_documents'] / row['documents_per_s'] / 3600
    )
    if phase != 'lm1b_build':
      assert row['tokens'] > row['documents'] and row['tokens_per_s'] > 0
      prefix = data_prep.CACHE_PREFIX[phase]
      assert row['cache_files'] and all(
        f.startswith(prefix) for f in row['cache_files']
      )
  return rows


def test_benchmark_runs_both_corpora_and_extrapolates(tmp_path, monkeypatch):
  out, record_dir, record = _bench(tmp_path, monkeypatch, 300, '1')
  _check_rows(record, 300, [1])
  stem = record_dir / f'data_prep_{record["date"]}'
  saved = json.loads(stem.with_suffix('.json').read_text())
  assert [r['phase'] for r in saved['phases']] == list(data_prep.PHASES)
  md = stem.with_suffix('.md').read_text()
  assert '| owt | 1 |' in md and '8,013,769' in md and '30,607,716' in md


@pytest.mark.slow
def test_benchmark_caches_are_the_same_for_two_processes(tmp_path, monkeypatch):
  # Just over one block of 2048 documents, so the worker pool runs.
  out, _, record = _bench(tmp_path, monkeypatch, 2100, '1,2')
  rows = _check_rows(record, 2100, [1, 2])
  for name in ('owt', 'lm1b'):
    one, two = rows[(name, 1)], rows[(name, 2)]
    assert one['tokens'] == two['tokens']
    assert one['cache_files'] == two['cache_files']
    for file in one['cache_files']:
      a = (out / 'cache_p1' / file).read_bytes()
      assert a == (out / 'cache_p2' / file).read_bytes()


def test_benchmark_refuses_bad_flags_before_generating(tmp_path):
  with pytest.raises(SystemExit, match='num_proc'):
    data_prep.main([f'--out={tmp_path}', '--num_proc=0'])
  with pytest.raises(SystemExit, match='owt_docs'):
    data_prep.main([f'--out={tmp_path}', '--owt_docs=5'])
  assert not list(tmp_path.iterdir())
