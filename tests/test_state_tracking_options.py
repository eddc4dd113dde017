"""State-tracking task options: task.loss_on, group tasks, model options.

The per-prefix loss is checked against an independent computation: every
prefix is scored as its own sequence through the last-token readout
(``SequenceClassifier.__call__`` on the truncated prefix), the prefix labels
are running products composed from explicit permutation tuples, and the
cross-entropy is a numpy log-softmax; padding is checked by appending junk
positions that must not change anything.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import pickle

import jax
import numpy as np
import pytest
from flax import nnx

from ddlm_jax.data import state_tracking as st
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.tasks import state_tracking as st_task
from ddlm_jax.training import metrics
from ddlm_jax.training.config import ConfigError
from experiments.configs import state_tracking as cfgs


def _config(task='s3', model='pdssm_paper', **task_opts):
  c = cfgs.get_config(f'{model},{task},smoke')
  c.model.num_layers = 1
  c.model.d_model = c.model.state_size = 8
  c.model.scan_impl = 'reference'  # Sequential scan: cheap to compile.
  c.task.update(task_opts)
  return c


def _s3_products(tokens, length, gens):
  """Running products of a word, from explicit permutations of 3 points."""
  elems = sorted(itertools.permutations(range(3)))
  prod, out = (0, 1, 2), []
  for t in tokens[:length]:
    g = elems[gens[t - 1]]
    prod = tuple(g[prod[i]] for i in range(3))  # Apply prod, then g.
    out.append(elems.index(prod))
  return out


def test_every_group_task_is_reachable_from_the_config_argument():
  assert set(cfgs.TASKS) == set(st.TASKS) | set(st.GROUP_TASKS)
  for name, spec in st.GROUP_TASKS.items():
    c = cfgs.get_config(f'pdssm_paper,{name},paper1')
    assert c.task.name == name and c.task.loss_on == 'last'
    ccfg = st_task.classifier_config(c)
    # By default every group element is a token (or the task's fixed
    # generators), plus PAD.
    tokens = len(spec.generators) or spec.num_classes
    assert (ccfg.vocab_size, ccfg.num_classes) == (
      tokens + 1,
      spec.num_classes,
    )
    if spec.generators:
      continue
    c.task.num_generators = 2
    ccfg = st_task.classifier_config(c)
    assert (ccfg.vocab_size, ccfg.num_classes) == (3, spec.num_classes)


def test_prefix_labels_of_the_train_stream_are_running_products():
  c = _config(num_generators=2, loss_on='prefix')
  task = st_task.state_tracking_task(c)
  batch = next(task.batches(0))
  gens = [int(g) for g in st.group_generators('S3', 2)]
  assert len(set(gens)) == 2 and 0 not in gens  # Not the identity.
  for tok, n, lab, pre in zip(
    batch['tokens'], batch['lengths'], batch['labels'], batch['prefix_labels']
  ):
    want = _s3_products(tok, n, gens)
    np.testing.assert_array_equal(pre[:n], want)
    assert lab == want[-1]
  # The last-token loss's stream carries no prefix labels.
  plain = next(st_task.state_tracking_task(_config()).batches(0))
  assert 'prefix_labels' not in plain


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


@functools.partial(
  jax.jit, static_argnums=0, compiler_options=st_task.FAST_COMPILE
)
def _last_token_logits(graphdef, params, tokens_BxL, lengths_B):
  return nnx.merge(graphdef, params)(tokens_BxL, lengths_B)


def test_prefix_loss_equals_independent_mean_over_real_positions():
  c = _config(loss_on='prefix')
  task = st_task.state_tracking_task(c)
  graphdef, init, _ = st_task.programs(st_task.classifier_config(c), True)
  params = jax.jit(init)(jax.random.key(3))
  loss = jax.jit(task.loss, compiler_options=st_task.FAST_COMPILE)
  data = st.make_split('s3', 'train', 4, seed=1, max_len=6, prefix_labels=True)
  lengths = data['lengths']
  gens = list(range(6))
  # Every prefix as its own sequence: label read at its last token.
  rows = [(b, t) for b in range(4) for t in range(lengths[b])]
  toks = np.zeros((len(rows), 6), np.int32)
  for i, (b, t) in enumerate(rows):
    toks[i, : t + 1] = data['tokens'][b, : t + 1]
  lens = np.array([t + 1 for _, t in rows], np.int32)
  logits = np.asarray(_last_token_logits(graphdef, params, toks, lens))
  labels = [_s3_products(data['tokens'][b], t + 1, gens)[-1] for b, t in rows]
  nll = -_log_softmax(logits.astype(np.float64))[np.arange(len(rows)), labels]
  want = nll.mean()  # Each real position once; padding nowhere.
  got, aux = loss(params, None, data)
  assert float(got) == pytest.approx(want, rel=1e-5)
  # Accuracies: last token (the logged 'acc') and every real position.
  last = [i for i, (b, t) in enumerate(rows) if t == lengths[b] - 1]
  hit = logits.argmax(-1) == np.array(labels)
  assert float(aux['acc']) == pytest.approx(hit[last].mean())
  assert float(aux['prefix_acc']) == pytest.approx(hit.mean())
  # Junk padding (more PAD columns, random prefix labels there) is ignored.
  pad = {
    'tokens': np.pad(data['tokens'], ((0, 0), (0, 5))),
    'lengths': lengths,
    'labels': data['labels'],
    'prefix_labels': np.concatenate(
      [data['prefix_labels'], np.random.default_rng(0).integers(0, 6, (4, 5))],
      axis=1,
    ),
  }
  padded, _ = loss(params, None, pad)
  assert float(padded) == pytest.approx(float(got), rel=1e-5)
  # Micro-batches weigh by their real positions (not their sequences).
  assert float(task.weight(data)) == lengths.sum()
  # 'last' is the benchmark's last-token loss, weighted per sequence.
  last_task = st_task.state_tracking_task(_config())
  got_last, _ = jax.jit(last_task.loss, compiler_options=st_task.FAST_COMPILE)(
    params, None, data
  )
  full = np.asarray(
    _last_token_logits(graphdef, params, data['tokens'], lengths)
  )
  want_last = -_log_softmax(full.astype(np.float64))[
    np.arange(4), data['labels']
  ]
  assert float(got_last) == pytest.approx(want_last.mean(), rel=1e-5)
  assert float(last_task.weight(data)) == 4


@pytest.mark.parametrize(
  'task, model, opts, match',
  [
    ('parity', 'pdssm', {'task.loss_on': 'prefix'}, 'needs a group task'),
    ('mod_arith', 'lstm', {'task.loss_on': 'prefix'}, 'needs a group task'),
    ('s3', 'pdssm', {'task.loss_on': 'every'}, r"task.loss_on='every'"),
    ('s3', 'pdssm', {'model.magnitude_init': 1.5}, 'model.magnitude_init'),
    ('s3', 'pdssm', {'model.magnitude_init': -0.2}, r'\(0, 1\)'),
    ('s3', 'lstm', {'model.magnitude_init': 0.9}, 'learned'),
    ('s3', 'selective_diag', {'model.magnitude_init': 0.9}, 'learned'),
    ('s3', 'pdssm', {'model.init': 'xavier'}, r"'default', 'authors'"),
    ('s3', 'transformer', {'model.init': 'authors'}, 'SSM mixers'),
    ('s3', 'pdssm', {'train.restarts': 0}, 'train.restarts'),
    ('s3', 'pdssm', {'train.restarts': -1}, 'train.restarts'),
    ('s3', 'pdssm', {'model.harden': 'matching'}, "model.relax='sinkhorn'"),
    ('s3', 'pdssm', {'model.harden': 'hungarian'}, 'model.harden'),
  ],
)
def test_bad_options_are_refused_before_compute(
  task, model, opts, match, tmp_path, monkeypatch
):
  c = _config(task, model)
  for key, value in opts.items():
    block, leaf = key.split('.')
    c[block][leaf] = value

  def no_compute(*args, **kwargs):
    raise AssertionError('the loop started before the config was checked')

  monkeypatch.setattr(st_task, 'fit', no_compute)
  with pytest.raises(ConfigError, match=match):
    st_task.train_state_tracking(c, str(tmp_path))
  assert os.listdir(tmp_path) == []


def test_model_options_reach_the_mixer():
  c = _config(model='pdssm')
  c.model.magnitude_init = 0.9
  c.model.init = 'authors'
  ccfg = st_task.classifier_config(c)
  assert dict(ccfg.mixer_kwargs)['magnitude_init'] == 0.9
  build = lambda cfg: sc.SequenceClassifier(cfg, rngs=nnx.Rngs(0))
  assert nnx.eval_shape(lambda: build(ccfg)).blocks[0].mixer.init == 'authors'
  # sigmoid(bias) = magnitude_init: |D_t| starts there.
  _, init, _ = st_task.programs(ccfg, True)
  params = jax.jit(init)(jax.random.key(0))
  bias = np.asarray(params['blocks'][0]['mixer']['mag_mlp']['fc2']['bias'])
  np.testing.assert_allclose(1 / (1 + np.exp(-bias)), 0.9, rtol=1e-6)
  # '' / 0 keep each mixer's default (the authors' init for pdssm_paper).
  for name, want in (('pdssm', 'default'), ('pdssm_paper', 'authors')):
    ccfg = st_task.classifier_config(_config(model=name))
    assert 'init' not in dict(ccfg.mixer_kwargs)
    model = nnx.eval_shape(lambda cfg=ccfg: build(cfg))
    assert model.blocks[0].mixer.init == want
  # A config saved before the keys existed builds the same model.
  old = _config(model='pdssm_paper')
  del old.model['init'], old.model['magnitude_init'], old.task['loss_on']
  assert st_task.classifier_config(old) == ccfg
  assert st_task.loss_on(old) == 'last'


@pytest.mark.slow
def test_pdssm_groups_trains_through_the_loop_and_records_p_t(tmp_path):
  from experiments import pdssm_groups

  out = str(tmp_path / 'run')
  summary = pdssm_groups.main(
    ['--task=s3', '--num_generators=2', '--preset=smoke', '--N=8',
     '--layers=1', '--steps=4', '--eval_every=2', '--loss=prefix',
     f'--out={out}']
  )  # fmt: skip
  # The one loop's state-tracking task ran with the per-prefix loss (this
  # is also the prefix-loss smoke run: 4 steps on s3, 2 generators).
  assert summary['finished'] and summary['status'] == 'ok', summary
  assert summary['steps'] == 4 and summary['loss_on'] == 'prefix'
  assert 0 <= summary['test_accuracy'] <= 1
  train = [r for r in metrics.read_metrics(out) if r['split'] == 'train']
  assert len(train) == 2 and all(
    np.isfinite(r['loss']) and 0 <= r['prefix_acc'] <= 1 and 0 <= r['acc'] <= 1
    for r in train
  )
  # What pdssm_posthoc.py reads: the settings and the best parameters.
  with open(os.path.join(out, 'summary.json')) as f:
    saved = json.load(f)
  assert (saved['task'], saved['k'], saved['N'], saved['layers']) == (
    's3',
    2,
    8,
    1,
  )
  # The best validation accuracy is the best of the validation records.
  accs = [
    r['accuracy']
    for r in metrics.read_metrics(out)
    if r['split'] == 'validation'
  ]
  assert saved['best_val'] == pytest.approx(max(accs))
  with open(os.path.join(out, 'best_params.pkl'), 'rb') as f:
    params = pickle.load(f)
  args = pdssm_groups.parse(['--task=s3', '--num_generators=2',
                             '--preset=smoke', '--N=8', '--layers=1',
                             f'--out={out}'])  # fmt: skip
  ccfg = st_task.classifier_config(pdssm_groups.build_config(args))
  # An abstract model (no initialisation to compute) has the same structure.
  model = nnx.eval_shape(lambda: sc.SequenceClassifier(ccfg, rngs=nnx.Rngs(0)))
  nnx.update(model, params)  # The structure matches the model's.
  # P_t diagnostics joined every validation record.
  val = [
    r
    for r in metrics.read_metrics(out)
    if r['split'] == 'validation' and 'diag' in r
  ]
  assert [r['step'] for r in val] == [2, 4]
  for r in val:
    d = r['diag']
    assert d['tokens'] == 2 and 1 <= d['distinct_P_over_tokens'] <= 2
    assert 1 <= d['orbit_e0'] <= 8 and 0 <= r['accuracy_train_lengths'] <= 1
