"""State-tracking trainer, configs and sweep (ddlm_jax.tasks.state_tracking).

Smoke runs are tiny (1 block, width 16, a few steps, cheap XLA compilation)
so every model trains through ``train_state_tracking`` within the budget.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.data import state_tracking as st
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.models import ssm, transformer
from ddlm_jax.tasks import state_tracking as st_task
from ddlm_jax.training import metrics
from experiments import sweep_state_tracking as sweep
from experiments.configs import state_tracking as cfgs


def _smoke(model, task, **train):
  c = cfgs.get_config(f'{model},{task},smoke')
  c.model.num_layers = 1
  c.train.update(train)
  return c


# One task per model keeps compile time down (complex_diag trains in the
# resume and NaN tests); a5 / s5 differ from the others only in vocabulary.
_MODEL_TASKS = [
  ('pdssm', 'cycle_nav'),
  ('selective_diag', 'even_pairs'),
  ('lstm', 'mod_arith'),
  ('transformer', 'a5'),
]


@pytest.mark.slow
@pytest.mark.parametrize('model,task', _MODEL_TASKS)
def test_smoke_training_each_model(model, task, tmp_path):
  c = _smoke(model, task, checkpoint_every=100)
  summary = st_task.train_state_tracking(c, str(tmp_path))
  assert summary['finished'] and summary['status'] == 'ok', summary
  assert summary['steps'] == c.train.num_steps
  # Accuracy is a count over the test set.
  hits = summary['test_accuracy'] * c.task.num_test
  assert abs(hits - round(hits)) < 1e-6 and 0 <= hits <= c.task.num_test
  assert np.isfinite(summary['test_loss'])
  assert summary['best_step'] in (2, 4)
  with open(tmp_path / 'summary.json') as f:
    assert json.load(f) == summary
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['model']['mixer'] == model
  records = metrics.read_metrics(str(tmp_path))
  splits = [r['split'] for r in records]
  assert splits.count('train') == 2 and splits.count('validation') == 2
  assert splits[-1] == 'test'
  assert all(np.isfinite(r['loss']) for r in records if r['split'] == 'train')
  # The length breakdown partitions the test set and averages to the total.
  rows = summary['test_accuracy_by_length']
  assert sum(r['n'] for r in rows) == c.task.num_test
  mean = sum(r['accuracy'] * r['n'] for r in rows) / c.task.num_test
  assert mean == pytest.approx(summary['test_accuracy'], abs=1e-6)
  if model == 'pdssm':
    # Rescoring from the checkpoint (for runs recorded without the
    # breakdown) rebuilds it exactly.
    del summary['test_accuracy_by_length']
    metrics.write_json(str(tmp_path / 'summary.json'), summary)
    again = sweep.rescore_by_length(str(tmp_path))
    assert again['test_accuracy_by_length'] == rows


def test_accuracy_by_length_buckets():
  hit = np.array([1, 0, 1, 1, 0, 0], np.float32)
  lengths = np.array([40, 41, 45, 50, 55, 59])
  rows = st_task.accuracy_by_length(hit, lengths, num_buckets=2)
  # Edges round(linspace(40, 60, 3)) = 40, 50, 60: [40, 49] and [50, 59].
  assert rows == [
    {'lengths': [40, 49], 'accuracy': pytest.approx(2 / 3), 'n': 3},
    {'lengths': [50, 59], 'accuracy': pytest.approx(1 / 3), 'n': 3},
  ]


def _resume_config():
  return _smoke(
    'complex_diag',
    'parity',
    num_steps=6,
    eval_every=3,
    log_every=1,
    checkpoint_every=3,
  )


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path):
  c = _resume_config()
  full = st_task.train_state_tracking(c, str(tmp_path / 'full'))
  c.train.halt_after_steps = 3
  part = st_task.train_state_tracking(c, str(tmp_path / 'part'))
  assert not part['finished'] and part['steps'] == 3
  assert 'test_accuracy' not in part
  resumed = st_task.train_state_tracking(c, str(tmp_path / 'part'))
  assert resumed['finished'] and resumed['steps'] == 6
  for key in ('test_accuracy', 'test_accuracy_final', 'best_val_accuracy'):
    assert resumed[key] == full[key], key
  np.testing.assert_allclose(resumed['test_loss'], full['test_loss'], 1e-6)
  train = lambda d: [
    r['loss']
    for r in metrics.read_metrics(str(tmp_path / d))
    if r['split'] == 'train'
  ]
  # Same losses at every logged step, including those after the restart.
  np.testing.assert_allclose(train('part'), train('full'), rtol=1e-6)


@pytest.mark.slow
def test_early_stop_is_final_and_tested(tmp_path):
  c = _resume_config()
  c.train.early_stop_accuracy = 1e-9  # Any validation score reaches it.
  summary = st_task.train_state_tracking(c, str(tmp_path))
  assert summary['steps'] == c.train.eval_every == 3
  assert summary['early_stop_step'] == 3 and summary['finished']
  assert 'test_accuracy' in summary
  # Starting the run again trains no further.
  again = st_task.train_state_tracking(c, str(tmp_path))
  assert again['steps'] == 3 and again['early_stop_step'] == 3
  assert again['test_accuracy'] == summary['test_accuracy']


@pytest.mark.slow
def test_nan_guard_stops_and_names_the_step(tmp_path, monkeypatch):
  # Same config as the resume test (its compiled programs are reused); the
  # third batch holds out-of-range token ids, whose embeddings are NaN.
  c = _resume_config()
  stream = st_task._train_stream

  def poisoned(config, seed):
    for i, batch in enumerate(stream(config, seed)):
      if i == 2:
        batch = {**batch, 'tokens': np.full_like(batch['tokens'], 99)}
      yield batch

  monkeypatch.setattr(st_task, '_train_stream', poisoned)
  summary = st_task.train_state_tracking(c, str(tmp_path))
  assert summary['status'] == 'nan' and not summary['finished']
  assert summary['bad_step'] == 3 and summary['steps'] == 3
  assert np.isfinite(summary['test_loss'])  # The state kept finite params.
  records = metrics.read_metrics(str(tmp_path))
  assert records[-2] == {'step': 3, 'split': 'train', 'bad_step': 3}


@pytest.mark.parametrize(
  'arg,match',
  [
    ('mamba,parity', 'unknown model'),
    ('pdssm,dyck', 'unknown task'),
    ('pdssm,parity,gpu', 'unknown preset'),
    ('pdssm', 'expected MODEL,TASK'),
    ('', 'expected MODEL,TASK'),
    ('pdssm,parity,cpu,x', 'expected MODEL,TASK'),
  ],
)
def test_config_parser_errors(arg, match):
  with pytest.raises(ValueError, match=match):
    cfgs.get_config(arg)


def test_every_config_builds_and_matches_the_registries():
  assert set(cfgs.MODELS) <= set(sc.MIXERS)
  assert set(cfgs.TASKS) == set(st.TASKS) | set(st.GROUP_TASKS)
  for preset in cfgs.PRESETS:
    for model in cfgs.MODELS:
      for task in cfgs.TASKS:
        if preset == 'groups' and model not in cfgs.GROUPS_MODELS:
          with pytest.raises(ValueError, match="'groups' preset"):
            cfgs.get_config(f'{model},{task},{preset}')
          continue
        c = cfgs.get_config(f'{model},{task},{preset}')
        ccfg = st_task.classifier_config(c)
        assert ccfg.mixer == model
        # h_0 reaches the SSM mixers: e_0 unless the recorded cpu table's
        # preset, and never passed to mixers that have no such option.
        kwargs = dict(ccfg.mixer_kwargs)
        if model in ssm.MODES:
          want = 'zeros' if preset == 'cpu' else 'onehot'
          assert kwargs['initial_state'] == want, (preset, model)
        else:
          assert 'initial_state' not in kwargs
        # A config's tokens: every element, or its num_generators (the
        # groups preset gives A5 the paper's 8 generators).
        k = c.task.num_generators or None
        assert (ccfg.vocab_size, ccfg.num_classes) == st.task_info(
          task, num_generators=k
        ), (model, task, preset)
  assert cfgs.get_config('pdssm,a5,groups').task.num_generators == 8
  paper = cfgs.get_config('pdssm,parity')
  assert (paper.model.d_model, paper.model.state_size) == (128, 128)
  assert (paper.model.num_dict, paper.model.num_layers) == (8, 2)
  assert paper.train.batch_size == 256 and paper.optim.learning_rate == 2e-3
  assert paper.optim.weight_decay == 0.01
  assert paper.optim.warmup_fraction == 0.1


def test_trainer_rejects_bad_config(tmp_path):
  c = _smoke('pdssm', 'parity')
  c.model.mixer = 'gru'
  with pytest.raises(ValueError, match='config.model.mixer'):
    st_task.train_state_tracking(c, str(tmp_path))
  c = _smoke('pdssm', 'parity')
  c.task.num_train = 4
  with pytest.raises(ValueError, match='num_train'):
    st_task.train_state_tracking(c, str(tmp_path))


def test_transformer_mixer_registers_and_runs():
  assert 'transformer' in sc.MIXERS and 'transformer' in sc.FULL_BLOCK_MIXERS
  cfg = sc.ClassifierConfig(
    5, 3, mixer='transformer', d_model=16, num_layers=1,
    mixer_kwargs=(('num_heads', 2),),
  )  # fmt: skip
  model = sc.SequenceClassifier(cfg, rngs=nnx.Rngs(0))
  block = model.blocks[0].block
  assert isinstance(block, transformer.Block)  # the suite's own block
  assert block.attn.causal and block.modulation is None
  tokens = jnp.array([[1, 2, 3, 4, 0, 0], [4, 3, 2, 1, 2, 3]], jnp.int32)
  lengths = jnp.array([4, 6])
  apply = jax.jit(
    lambda m, t, n: m(t, n), compiler_options=st_task.FAST_COMPILE
  )
  logits = apply(model, tokens, lengths)
  assert logits.shape == (2, 3) and np.isfinite(np.asarray(logits)).all()
  # Causal: what follows the last real token does not change its logits,
  # what precedes it does.
  other = tokens.at[0, 4:].set(jnp.array([3, 3]))
  np.testing.assert_allclose(apply(model, other, lengths), logits, atol=1e-5)
  changed = tokens.at[0, 0].set(2)
  assert not np.allclose(apply(model, changed, lengths)[0], logits[0])
  with pytest.raises(ValueError, match='num_heads'):
    sc.SequenceClassifier(
      sc.ClassifierConfig(5, 3, mixer='transformer', d_model=16,
                          mixer_kwargs=(('heads', 2),)),
      rngs=nnx.Rngs(0),
    )  # fmt: skip


def test_sweep_table_from_summaries(tmp_path):
  out = str(tmp_path)
  for seed, acc in ((0, 0.5), (1, 1.0)):
    d = sweep.run_dir(out, 'pdssm', 'parity', seed)
    os.makedirs(d)
    with open(os.path.join(d, 'summary.json'), 'w') as f:
      json.dump({'seed': seed, 'finished': True, 'status': 'ok',
                 'test_accuracy': acc, 'test_accuracy_final': acc,
                 'wall_s': 10.0}, f)  # fmt: skip
  # An unfinished run is not counted.
  d = sweep.run_dir(out, 'pdssm', 'parity', 2)
  os.makedirs(d)
  with open(os.path.join(d, 'summary.json'), 'w') as f:
    json.dump({'seed': 2, 'finished': False, 'status': 'ok'}, f)
  res = sweep.results_table(out, ['pdssm'], ['parity'], [0, 1, 2])
  assert sweep.plot_curves(out, ['pdssm'], ['parity'], [0, 1, 2]) is None
  writer = metrics.MetricsWriter(d)
  writer.write(5, 'validation', {'accuracy': 0.5, 'loss': 0.7})
  writer.close()
  path = sweep.plot_curves(out, ['pdssm'], ['parity'], [0, 1, 2])
  assert path == os.path.join(out, 'curves.png') and os.path.getsize(path)
  assert sweep.plot_by_length(out, ['pdssm'], ['parity'], [0, 1]) is None
  d0 = sweep.run_dir(out, 'pdssm', 'parity', 0)
  summary = sweep.load_summary(d0)
  summary['test_accuracy_by_length'] = [
    {'lengths': [40, 147], 'accuracy': 0.7, 'n': 2},
    {'lengths': [148, 256], 'accuracy': 0.3, 'n': 2},
  ]
  metrics.write_json(os.path.join(d0, 'summary.json'), summary)
  path = sweep.plot_by_length(out, ['pdssm'], ['parity'], [0, 1])
  assert path.endswith('accuracy_by_length.png') and os.path.getsize(path)
  row = res['runs'][0]
  assert row['seeds'] == [0, 1] and row['mean'] == 0.75
  assert row['std'] == pytest.approx(0.25) and row['paper'] == (99.9, 0.1)
  text = open(os.path.join(out, 'results.md')).read()
  assert '75.0 +- 25.0 (n=2)' in text and '99.9 +- 0.1' in text
  assert res['total_wall_s'] == 20.0


def test_sweep_skips_finished_runs(tmp_path, monkeypatch):
  out = str(tmp_path)
  for model in ('pdssm', 'lstm'):
    d = sweep.run_dir(out, model, 'parity', 0)
    os.makedirs(d)
    with open(os.path.join(d, 'summary.json'), 'w') as f:
      json.dump({'seed': 0, 'finished': True, 'status': 'ok',
                 'test_accuracy': 1.0, 'test_accuracy_final': 1.0,
                 'wall_s': 1.0}, f)  # fmt: skip

  def fail(*args):
    raise AssertionError('a finished run was trained again')

  monkeypatch.setattr(st_task, 'train_state_tracking', fail)
  res = sweep.sweep(out, ['pdssm', 'lstm'], ['parity'], [0], 'smoke')
  assert [r['mean'] for r in res['runs']] == [1.0, 1.0]
  with pytest.raises(ValueError, match='unknown model'):
    sweep.sweep(out, ['pdssm', 'mamba'], ['parity'], [0], 'smoke')
