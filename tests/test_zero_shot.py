"""Zero-shot suite: detokenizers, dataset loading, scoring a trained run.

Offline: small local stand-ins saved with datasets.save_to_disk take the
place of PTB/WikiText, the shipped TFDS fixture of LM1B, and a smoke run of
mdlm_owt.py is the model.
"""

import json

import jax
import numpy as np
import pytest

from ddlm_jax.data import detokenizers, pretrained
from ddlm_jax.data import zero_shot as zs_data
from ddlm_jax.evaluation import zero_shot
from ddlm_jax.evaluation.likelihood import evaluate_likelihood
from ddlm_jax.tasks import language_model as lm
from ddlm_jax.tasks import language_model as run_lib
from experiments.configs import mdlm_owt
from experiments.configs.common import FIXTURES

PTB_LINE = "the company 's N shares do n't pay $ N <unk> a\\/b"
WIKI_LINES = [
  ' = = Early life = = \n',
  ' The bridge is 3 @.@ 5 m ( 11 ft ) long , it \'s " old " . \n',
  '',
]


def _offline(monkeypatch):
  """HF offline mode (the env vars are read at import, so patch both)."""
  import datasets
  import huggingface_hub.constants

  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', True)
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)


def test_wikitext_detokenizer():
  assert detokenizers.wikitext(WIKI_LINES[0]) == ' == Early life ==\n'
  assert detokenizers.wikitext(WIKI_LINES[1]) == (
    ' The bridge is 3.5 m (11 ft) long, it\'s "old".\n'
  )
  assert detokenizers.wikitext('a 1 @,@ 000 b @-@ c') == 'a 1,000 b-c'


def test_ptb_detokenizer():
  assert detokenizers.ptb(PTB_LINE) == (
    "the company's 1 shares don't pay $1 ? a/b"
  )
  assert detokenizers.ptb(' N N N ') == ' 1 1 1 '  # Overlaps need repeats.


def test_lm1b_lambada_and_scientific_detokenizers():
  assert (
    detokenizers.lm1b(
      'He said , " see http : / / x.org ( now ) " . It costs $ 5 ?'
    )
    == 'He said, "see http://x.org (now)" . It costs $5?'
  )
  assert detokenizers.lm1b("It 's over .") == "It's over."
  assert (
    detokenizers.lambada('  \u201cHi,\u201d she said ') == '\n"Hi," she said'
  )
  text = 'the 2 @.@ 5 mg dose , see fig .'
  assert detokenizers.scientific_papers(text) == detokenizers.lm1b(
    detokenizers.wikitext(text)
  )
  assert detokenizers.get_detokenizer('') is None
  with pytest.raises(ValueError, match='Unknown detokenizer'):
    detokenizers.get_detokenizer('klingon')


def test_suite_follows_mdlm_splits_and_columns():
  assert zs_data.SUITE == (
    'ptb',
    'wikitext2',
    'lm1b',
    'lambada',
    'ag_news',
    'pubmed',
    'arxiv',
  )
  split = {n: d.split for n, d in zs_data.ZERO_SHOT_DATASETS.items()}
  assert split['lm1b'] == split['ag_news'] == split['lambada'] == 'test'
  assert split['ptb'] == split['wikitext2'] == split['pubmed'] == 'validation'
  assert zs_data.get_dataset('ptb').column == 'sentence'
  assert zs_data.get_dataset('arxiv').column == 'article'
  with pytest.raises(ValueError, match='Unknown zero-shot'):
    zs_data.get_dataset('imagenet')


@pytest.fixture(scope='module')
def stand_ins(tmp_path_factory):
  """save_to_disk copies: ptb as a DatasetDict, wikitext2 as a Dataset."""
  import datasets

  root = tmp_path_factory.mktemp('zero_shot_data')
  ptb = datasets.Dataset.from_dict({'sentence': [PTB_LINE] * 30})
  datasets.DatasetDict({'validation': ptb}).save_to_disk(root / 'ptb')
  wiki = datasets.Dataset.from_dict({'text': WIKI_LINES * 12})
  wiki.save_to_disk(root / 'wikitext2')
  return str(root)


def test_load_zero_shot_from_local_copies(stand_ins, monkeypatch):
  ptb = zs_data.load_zero_shot('ptb', data_dir=stand_ins)
  assert len(ptb) == 30 and ptb[0] == detokenizers.ptb(PTB_LINE)
  raw = zs_data.load_zero_shot('ptb', data_dir=stand_ins, detokenize=False)
  assert raw[0] == PTB_LINE
  wiki = zs_data.load_zero_shot('wikitext2', data_dir=stand_ins)
  assert wiki[1] == detokenizers.wikitext(WIKI_LINES[1])
  lm1b = zs_data.load_zero_shot('lm1b', tfds_data_dir=str(FIXTURES / 'lm1b'))
  raw_lm1b = zs_data.load_zero_shot(
    'lm1b', tfds_data_dir=str(FIXTURES / 'lm1b'), detokenize=False
  )
  assert len(lm1b) == len(raw_lm1b) == 200
  assert lm1b.get_many(range(5)) == [
    detokenizers.lm1b(t) for t in raw_lm1b.get_many(range(5))
  ]
  _offline(monkeypatch)
  with pytest.raises(pretrained.DataUnavailableError) as e:
    zs_data.load_zero_shot('ag_news', data_dir=stand_ins)
  assert 'save_to_disk' in str(e.value) and "'ag_news'" in str(e.value)


def test_packed_rows_join_documents_with_eos_and_frame():
  tok = pretrained.build_test_tokenizer(
    'test:bytebpe', ['alpha beta gamma'] * 10, 300
  )
  docs = ['alpha beta', 'gamma']
  eos = tok.special_ids.eos
  rows = zero_shot.packed_rows(docs, tok, seq_len=6, wrap='bos_eos')
  want = np.concatenate([np.append(tok.encode(d), eos) for d in docs])
  np.testing.assert_array_equal(rows.tokens, want)
  assert rows.bos == rows.eos == eos
  with pytest.raises(ValueError, match='subword tokenizer'):
    from ddlm_jax.data.text8 import Text8Tokenizer

    zero_shot.packed_rows(docs, Text8Tokenizer(), seq_len=6, wrap='bos_eos')


@pytest.fixture(scope='module')
def owt_run(tmp_path_factory):
  """A trained mdlm_owt.py:smoke run (fixture data, test tokenizer)."""
  workdir = tmp_path_factory.mktemp('owt_run')
  c = mdlm_owt.get_config('smoke')
  c.data.cache_dir = str(workdir / 'cache')
  c.mesh.shape = (1, 1, 1)
  c.sample.num_samples = 0
  summary = lm.train_and_evaluate(c, str(workdir / 'run'))
  return str(workdir / 'run'), summary


@pytest.mark.slow
def test_mdlm_owt_smoke_trains_end_to_end(owt_run):
  _, summary = owt_run
  assert summary['steps'] == 6
  assert np.isfinite(summary['validation']['nats_per_token'])


@pytest.mark.slow
def test_zero_shot_cli_scores_a_restored_run(owt_run, stand_ins, capsys):
  from absl import flags

  from experiments import zero_shot as cli

  workdir, _ = owt_run
  argv = [
    'zero_shot',
    f'--workdir={workdir}',
    '--datasets=ptb,wikitext2',
    f'--data_dir={stand_ins}',
    '--mesh_shape=1,1,1',
  ]
  flags.FLAGS(argv)
  try:
    cli.main([argv[0]])
  finally:
    flags.FLAGS.unparse_flags()
  table = capsys.readouterr().out
  assert 'ptb' in table and 'wikitext2' in table and 'ppl <=' in table
  with open(f'{workdir}/zero_shot.json') as f:
    results = json.load(f)
  seq_len = 32
  for name in ('ptb', 'wikitext2'):
    r = results[name]
    assert r['step'] == 6 and r['num_tokens'] == r['num_sequences'] * seq_len
    assert np.isfinite(r['nats_per_token'])
    assert r['perplexity_bound'] == pytest.approx(np.exp(r['nats_per_token']))


@pytest.mark.slow
def test_zero_shot_score_equals_the_likelihood_evaluator(owt_run, stand_ins):
  from ddlm_jax.data import sources

  workdir, _ = owt_run
  config = run_lib.load_config(workdir)
  config.mesh.shape = (1, 1, 1)
  run = lm.Run(config, workdir)
  assert run.restore() == 6
  run.checkpointer.close()
  docs = zs_data.load_zero_shot('ptb', data_dir=stand_ins)
  rows = zero_shot.packed_rows(
    docs, run.data.tokenizer, seq_len=32, wrap='bos_eos'
  )
  n = rows.num_windows(32)
  assert n % 8  # A partial last batch: exercises the padding.
  # Batch 8 and one time sample: the shapes the run's final eval compiled.
  nll = zero_shot.score_rows(
    run, rows, batch_size=8, max_batches=None, time_samples=1, seed=3
  )
  assert nll.shape == (n,)
  full = sources.packed_eval_batches(rows, seq_len=32, batch_size=8)
  ref = evaluate_likelihood(
    run.eval_params(),
    run.graphdef,
    run.process,
    [b['tokens'] for b in full],
    key=jax.random.key(3),
    time_samples=1,
  )
  kept = nll[: len(full) * 8]
  assert kept.mean() / 32 == pytest.approx(ref['nats_per_token'], rel=1e-5)


def test_unknown_dataset_fails_before_restoring(tmp_path):
  with pytest.raises(ValueError, match='Unknown zero-shot'):
    lm.evaluate_zero_shot(str(tmp_path), ['ptb', 'mnist'])
  with pytest.raises(FileNotFoundError, match='config.json'):
    lm.evaluate_zero_shot(str(tmp_path), ['ptb'])
