"""Progress while a run works, and the few lines that close each mode."""

import json
import shutil
import types

import pytest

from ddlm_jax.tasks import language_model as lm
from ddlm_jax.tasks.language_model import load_config
from ddlm_jax.training import metrics, progress


def test_rate_and_eta_exclude_compilation(monkeypatch, capsys):
  clock = iter([0.0, 0.0, 100.0, 110.0])  # made, started, compiled, step 11
  fake_time = types.SimpleNamespace(perf_counter=lambda: next(clock))
  monkeypatch.setattr(metrics, 'time', fake_time)
  bar = metrics.Progress(total_steps=101, tokens_per_step=1000)
  bar.start(0)  # t = 0; the first step compiles until t = 100.
  bar.compiled(1)
  rate = bar.report(11, {'loss': 2.0})  # 10 steps in 10 s.
  out = capsys.readouterr().out.splitlines()
  assert out[0] == 'compiling the train step (from step 0/101)...'
  assert out[1] == 'compiled and ran the first step in 100.0s'
  assert rate['steps_per_sec'] == pytest.approx(1.0)
  assert out[2].endswith('1.00 steps/s | 1.0k tok/s | ETA 1m30s')


def test_batches_show_a_bar_and_yield_everything(capsys):
  assert list(progress.batches(range(5), 'evaluating validation')) == [
    0,
    1,
    2,
    3,
    4,
  ]
  assert 'evaluating validation' in capsys.readouterr().out
  assert list(progress.batches([7, 8, 9], 'few')) == [7, 8, 9]
  assert 'few' not in capsys.readouterr().out  # No bar for a few batches.


def test_timed_reports_the_phase(capsys):
  with progress.timed('sampling: compiling eb'):
    pass
  out = capsys.readouterr().out.splitlines()
  assert out[0] == 'sampling: compiling eb...'
  assert out[1].startswith('sampling: compiling eb: ') and out[1][-1] == 's'


def test_train_summary_is_short_and_names_the_files(smoke_mdlm_run):
  workdir, summary = smoke_mdlm_run
  text = progress.mode_summary(summary, 'train', workdir)
  lines = text.splitlines()
  assert lines[0] == '--- train done ---'
  assert len(lines) <= 10 and len(text) < 1000
  assert lines[1].startswith('trained 6/6 steps (ok) in ')
  v = summary['validation']
  assert lines[2] == (
    f'final validation: {v["bits_per_token"]:.4f} +- '
    f'{v["bits_per_token_stderr"]:.4f} bits/token (perplexity <= '
    f'{v["perplexity_bound"]:.3f}; {v["num_sequences"]} sequences)'
  )
  assert f'summary.json: {workdir}/summary.json' in lines


def test_sample_summary_shows_the_first_samples(smoke_mdlm_run, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(smoke_mdlm_run[0], workdir)
  config = load_config(
    str(workdir), {'sample.num_samples': 3, 'sample.steps': 4}
  )
  result = lm.sample_checkpoint(config, str(workdir))
  text = progress.mode_summary(result, 'sample', str(workdir))
  lines = text.splitlines()
  assert lines[:2] == ['--- sample done ---', 'sampled step 6']
  assert lines[2].startswith('samples: 3 from ancestral (4 steps, NFE ')
  shown = progress.first_samples(str(workdir / 'samples.txt'))
  assert len(shown) == 2 and all(len(s) == 32 for s in shown)
  assert lines[3] == f'  [0] {shown[0]!r}' and lines[4] == f'  [1] {shown[1]!r}'
  assert lines[5] == f'  all samples: {workdir / "samples.txt"}'
  stats = json.loads((workdir / 'sample_stats.json').read_text())
  assert stats['num_samples'] == 3  # The full record stays in the JSON.


def test_eval_and_preempted_summaries(tmp_path):
  ev = {
    'bits_per_token': 2.5,
    'bits_per_token_stderr': 0.125,
    'perplexity_bound': 5.657,
    'num_sequences': 16,
    'step': 40,
  }
  text = progress.mode_summary(ev, 'eval', str(tmp_path), 'test')
  assert text.splitlines()[1] == (
    'test at step 40: 2.5000 +- 0.1250 bits/token (perplexity <= 5.657; '
    '16 sequences)'
  )
  text = progress.mode_summary({'preempted_at_step': 7}, 'train', 'w')
  assert text.startswith('preempted at step 7: checkpoint saved in w;')
