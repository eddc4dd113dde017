"""The frontier command: its pure pieces, the sampler grid, and a smoke run
on the quickstart smoke model."""

import json
import math
import os

import numpy as np
import pytest

from experiments import frontier
from experiments.configs import quickstart


def test_matched_value_interpolates_in_entropy_and_reports_the_gap():
  # Entropies out of order (a temperature sweep), values follow them.
  value, gap = frontier.matched_value([3.0, 2.0, 4.0], [5.0, 4.0, 7.0], 3.5)
  assert value == pytest.approx(6.0) and gap == 0.0
  value, gap = frontier.matched_value([3.0, 2.0], [5.0, 4.0], 1.5)
  assert value == 4.0 and gap == pytest.approx(0.5)
  value, gap = frontier.matched_value([3.0], [5.0], 3.25)
  assert value == 5.0 and gap == pytest.approx(0.25)
  with pytest.raises(ValueError, match='at least one point'):
    frontier.matched_value([], [], 1.0)


def test_curve_area_is_the_trapezoid_over_log_parallelism():
  area, mean = frontier.curve_area([2.0, 0.0, 1.0], [4.0, 2.0, 2.0])
  # Sorted: (0, 2), (1, 2), (2, 4): 2 + 3 = 5 over a width of 2.
  assert area == pytest.approx(5.0) and mean == pytest.approx(2.5)
  assert frontier.curve_area([0.0], [3.0]) == (0.0, 3.0)


def test_knob_grid_covers_each_samplers_natural_knob():
  grid = frontier.knob_grid('threshold', 32)
  assert [p['threshold'] for _, _, p in grid] == list(frontier.THRESHOLDS)
  steps = [p['num_steps'] for _, _, p in frontier.knob_grid('ancestral', 32)]
  assert steps == [4, 8, 16, 32]
  cache = frontier.knob_grid('approx_cache', 32)
  curves = {c for c, _, _ in cache}
  assert curves == {f'approx_cache {c}' for c in ('none', 'dual', 'prefix')}
  assert frontier.knob_grid('approx_cache', 32, cache_ok=False) == []
  assert frontier.knob_grid('scheduled', 32) == []
  assert frontier.knob_grid('first_hitting', 32) == [('first_hitting', '', {})]
  assert frontier.spread([1, 2, 3, 4, 5], 2) == [1, 5]
  # Block models: the threshold rule and ancestral steps inside each block.
  block = frontier.knob_grid('block', 32, block_size=8)
  assert {c for c, _, _ in block} == {'block+threshold', 'block+ancestral'}
  point = {'knob': block[0][1], 'params': block[0][2], 'curve': block[0][0]}
  assert frontier.point_label(point) == 'block+threshold threshold=1.0'


def test_cache_support_and_bad_flags_are_refused_before_loading(tmp_path):
  from flax import nnx

  from ddlm_jax.models.transformer import Transformer, TransformerConfig

  def model(**kw):
    cfg = TransformerConfig(vocab_size=5, input_vocab_size=6, width=16,
                            depth=1, num_heads=2, **kw)  # fmt: skip
    return Transformer(cfg, rngs=nnx.Rngs(0))

  assert frontier.cache_support(model(), 8) is None
  assert 'exact block cache' in frontier.cache_support(model(block_size=4), 8)
  assert 'causal' in frontier.cache_support(model(causal=True), 8)
  assert 'no kv_pass' in frontier.cache_support(lambda z, t: z, 8)
  config = quickstart.get_config('smoke')
  missing = str(tmp_path / 'nothing')
  with pytest.raises(ValueError, match="unknown sampler 'bogus'"):
    frontier.frontier(config, missing, frontier.Options(samplers='bogus'))
  with pytest.raises(ValueError, match='give sampler names only'):
    frontier.frontier(config, missing, frontier.Options(samplers='eb:gamma=1'))
  with pytest.raises(ValueError, match='temperatures'):
    frontier.frontier(config, missing, frontier.Options(temperatures=(0.0,)))
  with pytest.raises(FileNotFoundError, match='not a run directory'):
    frontier.frontier(config, missing, frontier.Options())


@pytest.mark.slow
def test_frontier_smoke_run_writes_table_plot_and_meter(
  smoke_mdlm_run, tmp_path
):
  workdir, _ = smoke_mdlm_run
  config = quickstart.get_config('smoke')
  opts = frontier.Options(
    samplers='confidence;threshold;approx_cache;scheduled',
    temperatures=(0.9, 1.0),
    points=2,
    num_samples=2,
    out=str(tmp_path / 'out'),
  )
  result = frontier.frontier(config, workdir, opts)
  files = sorted(os.listdir(tmp_path / 'out'))
  assert files == ['frontier.json', 'frontier.md', 'frontier.png']
  saved = json.loads((tmp_path / 'out' / 'frontier.json').read_text())
  assert len(saved['rows']) == len(result['rows'])
  curves = {r['curve'] for r in result['rows']}
  assert curves == {
    'confidence', 'threshold', 'approx_cache none', 'approx_cache dual',
    'approx_cache prefix',
  }  # fmt: skip
  assert [s['name'] for s in result['skipped']] == ['scheduled']
  length = config.data.seq_len
  for row in result['rows']:
    assert 1 <= row['nfe'] <= length
    assert row['tokens_per_call'] == pytest.approx(length / row['nfe'])
    assert row['tokens_per_sec'] > 0 and row['entropy'] > 0
    assert row['flops_per_sample'] > 0
    assert set(row['by_temperature']) == {'0.9', '1.0'}
    assert 'gen_nll_matched' not in row  # no scorer in the smoke config
    if row['name'] == 'approx_cache':
      assert row['params']['block_length'] == length // 4
      exact = row['knob_value'] == 1 or row['curve'] == 'approx_cache none'
      kind = 'exact' if exact else 'approximate'
      assert row['meter']['cache_kind'] == kind
      if kind == 'exact':
        assert row['meter']['kl_max'] == 0.0
      else:
        assert row['meter']['meter_calls'] > 0
  # The dual cache's window calls cost less than full passes.
  flops = {
    (r['curve'], r['knob_value']): r['flops_per_sample'] for r in result['rows']
  }
  assert flops['approx_cache dual', 0] < flops['approx_cache dual', 1]
  threshold_one = [
    r for r in result['rows'] if r['curve'] == 'threshold'
    and r['knob_value'] == 1.0
  ]  # fmt: skip
  assert threshold_one and threshold_one[0]['nfe'] == length
  for curve in result['curves'].values():
    lo, hi = curve['log2_tokens_per_call']
    assert 0 <= lo <= hi <= math.log2(length) and 'auc' not in curve
  table = (tmp_path / 'out' / 'frontier.md').read_text()
  assert 'approx_cache dual refresh=' in table and '(approximate)' in table
  assert np.isfinite(saved['target_entropy'])
  # Samples at --config's length, here twice the training length.
  config.data.seq_len = 2 * length
  opts = frontier.Options(
    samplers='threshold', temperatures=(1.0,), points=1, num_samples=2,
    out=str(tmp_path / 'long'),
  )  # fmt: skip
  long = frontier.frontier(config, workdir, opts)
  assert (long['length'], long['trained_length']) == (2 * length, length)
  assert long['rows'][0]['nfe'] == 2 * length  # threshold 1.0
  # A config that does not describe the run is refused before sampling.
  config.model.width = 64
  with pytest.raises(ValueError, match='model.width=64'):
    frontier.frontier(config, workdir, opts)


@pytest.mark.slow
def test_frontier_with_an_ar_scorer_matches_entropy_and_integrates(
  smoke_mdlm_run, tmp_path
):
  from ddlm_jax.tasks import language_model as lm
  from experiments.configs import ar_quickstart

  ar = ar_quickstart.get_config('smoke')
  ar.sample.num_samples = 0
  ar.mesh.shape = (1, 1, 1)
  scorer = str(tmp_path / 'ar')
  lm.train_and_evaluate(ar, scorer)
  workdir, _ = smoke_mdlm_run
  opts = frontier.Options(
    scorer=scorer, samplers='threshold', temperatures=(0.5, 1.0), points=2,
    num_samples=2, out=str(tmp_path / 'out'),
  )  # fmt: skip
  result = frontier.frontier(quickstart.get_config('smoke'), workdir, opts)
  assert result['scorer'] == scorer and len(result['rows']) == 2
  for row in result['rows']:
    sweep = row['by_temperature']
    nll = [sweep[t]['gen_nll'] for t in ('0.5', '1.0')]
    ent = [sweep[t]['entropy'] for t in ('0.5', '1.0')]
    assert row['gen_nll'] == nll[1] > 0
    # The matched value lies between the swept ones (or is the nearest).
    lo, hi = min(nll), max(nll)
    assert lo - 1e-9 <= row['gen_nll_matched'] <= hi + 1e-9
    inside = min(ent) <= result['target_entropy'] <= max(ent)
    assert (row['entropy_gap'] == 0.0) == inside
  curve = result['curves']['threshold']
  assert 'auc' in curve and np.isfinite(curve['auc_per_octave'])
  table = (tmp_path / 'out' / 'frontier.md').read_text()
  assert 'gen-NLL (matched H)' in table
