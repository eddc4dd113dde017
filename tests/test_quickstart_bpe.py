"""The BPE quickstart configs, their sweeps' flags, end to end at smoke size.

The smoke presets train a 300-token BPE on the first 40k characters of each
Shakespeare split; the MDLM's samples are scored by the AR smoke run, as
the full config scores them by runs/quickstart_bpe_ar.
"""

from __future__ import annotations

import math
import os
import types

import numpy as np
import pytest

from ddlm_jax.data import corpus, tokenizers
from ddlm_jax.tasks.language_model import load_run
from experiments import modes, sweep_samplers, sweep_soft_masking
from experiments.configs import (
  ar_quickstart_bpe,
  quickstart,
  quickstart_bpe,
)
from experiments.configs.common import override

BPE_CONFIG = os.path.join(
  os.path.dirname(quickstart_bpe.__file__), 'quickstart_bpe.py'
)


def _smoke(module, **overrides):
  """The smoke preset, with one checkpoint and no periodic evaluation."""
  c = module.get_config('smoke')
  c.sample.num_samples = 2 if c.process.kind == 'mdlm' else 0
  c.train.eval_every = c.train.checkpoint_every = c.train.num_steps
  c.mesh.shape = (1, 1, 1)
  return override(c, overrides)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The AR and MDLM smoke runs: workdirs, configs and summaries."""
  ar_dir = str(tmp_path_factory.mktemp('bpe_ar'))
  ar_cfg = _smoke(ar_quickstart_bpe)
  md_dir = str(tmp_path_factory.mktemp('bpe_mdlm'))
  md_cfg = _smoke(quickstart_bpe, **{'sample.scorer': ar_dir})
  return types.SimpleNamespace(
    ar_dir=ar_dir,
    ar_cfg=ar_cfg,
    ar=modes.run(ar_cfg, ar_dir),
    md_dir=md_dir,
    md_cfg=md_cfg,
    md=modes.run(md_cfg, md_dir),
  )


def test_full_configs_are_twins_in_the_bpe_regime():
  md, ar = quickstart_bpe.get_config(), ar_quickstart_bpe.get_config()
  assert (md.data.tokenizer, md.data.bpe_vocab_size) == ('bpe', 2048)
  assert md.data.seq_len == 48 and md.data.corpus == 'shakespeare'
  assert md.sample.scorer == 'runs/quickstart_bpe_ar'
  assert (md.process.kind, ar.process.kind) == ('mdlm', 'ar')
  a, b = md.to_dict(), ar.to_dict()
  for block in ('data', 'model', 'optim', 'train', 'eval'):
    assert a[block] == b[block], block
  # The network is the char quickstart recipe's (the transformer of
  # mdlm_quickstart.py); only the data changes.
  assert md.model.to_dict() == quickstart.recipe().model.to_dict()
  with pytest.raises(ValueError, match='preset'):
    quickstart_bpe.get_config('tiny')


def test_long_preset_keeps_tokens_per_step_and_its_own_twin():
  base = quickstart_bpe.get_config()
  md = quickstart_bpe.get_config('long')
  ar = ar_quickstart_bpe.get_config('long')
  assert md.data.seq_len == ar.data.seq_len == 512
  tokens = md.data.seq_len * md.train.batch_size
  assert tokens == base.data.seq_len * base.train.batch_size
  assert md.sample.scorer == 'runs/quickstart_bpe_long_ar'
  assert ar.process.kind == 'ar' and md.model.to_dict() == base.model.to_dict()
  assert quickstart_bpe.get_config('long,smoke').data.seq_len == 32


def test_smoke_excerpt_is_the_corpus_prefix():
  paths = quickstart_bpe.smoke_files()
  full = corpus.load_text_splits('shakespeare')
  for name, path in paths.items():
    with open(path, encoding='utf-8') as f:
      text = f.read()
    assert text == full[name][: quickstart_bpe.SMOKE_CHARS], name


@pytest.mark.slow
def test_smoke_runs_train_evaluate_and_score(runs):
  for summary in (runs.ar, runs.md):
    assert summary['steps'] == 6
    assert np.isfinite(summary['validation']['bits_per_token'])
  # The MDLM's samples are scored by its AR twin, on the same token ids.
  samples = runs.md['samples']
  assert samples['scorer'] == runs.ar_dir
  assert math.isfinite(samples['gen_ppl_corpus'])
  assert samples['gen_ppl_corpus'] > 1.0
  # --mode=eval restores the checkpoint and reproduces the final bound
  # (same windows; the AR NLL is exact, the MDLM draws the same t, z_t).
  for kind in ('ar', 'md'):
    workdir, summary = getattr(runs, f'{kind}_dir'), getattr(runs, kind)
    again = modes.run(getattr(runs, f'{kind}_cfg'), workdir, 'eval')
    np.testing.assert_allclose(
      again['bits_per_token'],
      summary['validation']['bits_per_token'],
      rtol=1e-5,
    )


@pytest.mark.slow
def test_tokenizer_is_saved_with_the_run_and_reloads_the_same_ids(runs):
  saved_md = tokenizers.load_tokenizer(os.path.join(runs.md_dir, 'tokenizer'))
  saved_ar = tokenizers.load_tokenizer(os.path.join(runs.ar_dir, 'tokenizer'))
  assert isinstance(saved_md, tokenizers.BPETokenizer)
  assert saved_md == saved_ar  # Deterministic training: one id space.
  c = runs.md_cfg
  with open(c.data.files.train, encoding='utf-8') as f:
    train = f.read()
  fresh = tokenizers.build_tokenizer(
    'bpe', train, vocab_size=c.data.bpe_vocab_size
  )
  text = 'To be, or not to be: that is the question.\nHAMLET. Ay, my lord.'
  ids = fresh.encode(text)
  np.testing.assert_array_equal(saved_md.encode(text), ids)
  assert saved_md.decode(ids) == text
  assert ids.size < len(text)  # Merges were learnt.


@pytest.mark.slow
def test_run_has_the_configured_vocabulary_and_length(runs):
  run = load_run(runs.md_dir)
  run.close()
  c = run.config
  assert run.data.tokenizer.vocab_size == c.data.bpe_vocab_size == 300
  assert run.process.vocab_size == 300  # The mask id is 300, outside.
  batch = run.data.eval_batches(
    'validation', seq_len=c.data.seq_len, batch_size=2, max_batches=1
  )[0]['tokens']
  assert batch.shape == (2, 32) and batch.max() < 300


@pytest.mark.slow
def test_soft_masking_base_moves_the_arms_to_the_bpe_regime(runs, tmp_path):
  delta = sweep_soft_masking.base_overrides(BPE_CONFIG, '')
  assert delta['data.tokenizer'] == 'bpe'
  assert delta['data.bpe_vocab_size'] == 2048
  assert delta['data.seq_len'] == 48 and delta['train.batch_size'] == 64
  moved = set(delta) - {'train.batch_size'}
  assert not any(k.split('.')[0] in ('train', 'optim') for k in moved)
  assert 'sample.scorer' not in delta
  args = types.SimpleNamespace(base=BPE_CONFIG, preset='')
  arm = sweep_soft_masking.arm_config('sm', args)
  assert arm.soft_mask.enabled and arm.data.tokenizer == 'bpe'
  assert arm.train.num_steps == 300 and arm.optim.learning_rate == 3e-4
  assert sweep_soft_masking.base_overrides('', '') == {}
  # A start run of another regime is refused before any training.
  md_dir = runs.md_dir
  smoke = sweep_soft_masking.arm_config(
    'sm', types.SimpleNamespace(base=BPE_CONFIG, preset='smoke')
  )
  sweep_soft_masking.check_init_from(smoke, md_dir)
  char = sweep_soft_masking.arm_config(
    'sm', types.SimpleNamespace(base='', preset='smoke')
  )
  with pytest.raises(ValueError, match='data.tokenizer.*--base'):
    sweep_soft_masking.check_init_from(char, md_dir)
  with pytest.raises(ValueError, match='not a file'):
    sweep_soft_masking.base_overrides(str(tmp_path / 'nope.py'), '')


def test_sampler_sweep_combines_seeds_with_standard_errors():
  rows = [
    {'label': 'eb', 'sample_seed': s, 'nfe': n, 'mauve': m}
    for s, n, m in ((0, 10.0, 0.5), (1, 12.0, 0.7), (2, 14.0, 0.9))
  ]
  row = sweep_samplers.combine_seeds(rows)
  assert row['nfe'] == pytest.approx(12.0)
  # std(ddof=1) of (10, 12, 14) is 2; / sqrt(3).
  assert row['nfe_se'] == pytest.approx(2.0 / math.sqrt(3))
  assert row['mauve_se'] == pytest.approx(0.2 / math.sqrt(3))
  assert [r['seed'] for r in row['per_seed']] == [0, 1, 2]
  assert sweep_samplers.combine_seeds(rows[:1]) == rows[0]
  assert '| 12 +- 1.1547 |' in sweep_samplers.table([row], None)
  for bad in ('', '0,0', '-1'):
    with pytest.raises(ValueError, match='--seeds'):
      sweep_samplers.parse_seeds(bad)
