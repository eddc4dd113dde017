"""The benchmark scripts run at tiny sizes and report what they promise.

Timings of tiny programs on a shared CPU are noise, so these tests check
structure (every field present, finite, positive where it must be) and the
quantities that do not depend on timing: FLOPs from XLA's cost analysis
(forward < forward+backward <= step) and NFE.
"""

from __future__ import annotations

import math
import re

import pytest

from experiments.benchmarks import op_profile, samplers, train_step

POSITIVE = (
  'step_seconds',
  'forward_seconds',
  'forward_backward_seconds',
  'tokens_per_sec',
  'step_gflops',
  'forward_gflops',
  'forward_backward_gflops',
  'backward_gflops',
  'achieved_gflops_per_sec',
  'mfu',
  'compiled_argument_mib',
  'params',
)
# Differences of two noisy medians: finite, but at tiny sizes of either sign.
FINITE = ('backward_seconds', 'optimizer_seconds', 'final_loss')


@pytest.fixture(scope='module')
def compared(tmp_path_factory):
  prof = tmp_path_factory.mktemp('profile')
  return train_step.main(
    [
      '--tiny',
      '--compare=--dtype=float32;--dtype=bfloat16 --time_conditioning',
      f'--profile={prof}',
    ]
  ), prof


@pytest.mark.slow
def test_train_step_reports_times_flops_and_memory(compared):
  result, _ = compared
  assert result['matmul_peak_gflops_per_sec'] > 0
  assert result['matmul_peak_bf16_gflops_per_sec'] > 0
  assert result['process_peak_rss_mib'] > 0
  for row in result['variants']:
    for k in POSITIVE:
      assert math.isfinite(row[k]) and row[k] > 0, (k, row[k])
    for k in FINITE:
      assert math.isfinite(row[k]), (k, row[k])
    # The backward adds FLOPs to the forward, the AdamW update more still.
    assert row['forward_gflops'] < row['forward_backward_gflops']
    assert row['forward_backward_gflops'] <= row['step_gflops']
    assert row['backward_seconds'] == pytest.approx(
      row['forward_backward_seconds'] - row['forward_seconds']
    )
    assert all(len(v) == 2 for v in row['seconds_per_round'].values())


@pytest.mark.slow
def test_compare_builds_both_variants_and_their_ratio(compared):
  result, _ = compared
  a, b = result['variants']
  assert (
    a['config']['dtype'] == 'float32' and not a['config']['time_conditioning']
  )
  assert b['config']['dtype'] == 'bfloat16' and b['config']['time_conditioning']
  assert 'mfu_vs_bf16_peak' in b and 'mfu_vs_bf16_peak' not in a
  # adaLN adds parameters; the tiny preset applies to both variants.
  assert b['params'] > a['params']
  assert a['config']['width'] == b['config']['width'] == 32
  assert result['ratio']['step'] == pytest.approx(
    a['step_seconds'] / b['step_seconds']
  )
  for k in ('forward', 'forward_backward'):  # Each program's own ratio.
    assert b['speedup_vs_first'][k] == pytest.approx(
      a[f'{k}_seconds'] / b[f'{k}_seconds']
    )
  assert a['speedup_vs_first'] == {
    'step': 1.0,
    'forward': 1.0,
    'forward_backward': 1.0,
  }


@pytest.mark.slow
def test_profile_writes_a_trace_and_the_time_per_source_line(compared):
  _, prof = compared
  assert list(prof.rglob('*.xplane.pb'))
  tables = sorted(prof.rglob('ops.md'))
  assert len(tables) == 6  # 2 variants x (step, forward, forward_backward)
  step = (prof / 'variant0' / 'step' / 'ops.md').read_text()
  # The Dense layers' matmuls are found and named by their source line.
  assert re.search(r'\| matmul \| models/layers\.py:\d+ Dense', step), step


# A compiled module's text as XLA prints it, cut to what op_table reads:
# two ops of the entry computation, one forward matmul under a model
# frame, one backward elementwise op with no model frame.
_HLO = """HloModule jit_step

FileNames
1 "/src/ddlm_jax/models/layers.py"
2 "/src/ddlm_jax/training/steps.py"

FunctionNames
1 "Dense.__call__"
2 "train_step"

FileLocations
1 {file_name_id=1 function_name_id=1 line=104 end_line=104 column=1}
2 {file_name_id=2 function_name_id=2 line=170 end_line=170 column=1}

StackFrames
1 {file_location_id=2 parent_frame_id=1}
2 {file_location_id=1 parent_frame_id=1}

ENTRY %main () -> f32[] {
  %f.1 = f32[8] fusion(), metadata={op_name="j/dot_general" stack_frame_id=2}
  ROOT %a.3 = f32[] add(), metadata={op_name="transpose(b)/a" stack_frame_id=1}
  %copy.2 = f32[8] copy(), metadata={op_name="jit(step)/copy"}
}
"""


def test_op_table_attributes_ops_to_model_source_lines():
  seconds = {'f.1': 0.3, 'a.3': 0.1, 'copy.2': 0.1, 'absent.9': 5.0}
  rows = op_profile.op_table(seconds, _HLO)
  got = [(r['direction'], r['kind'], r['source']) for r in rows]
  assert got == [
    ('forward', 'matmul', 'models/layers.py:104 Dense.__call__'),
    ('backward', 'elementwise', 'training/steps.py:170 train_step'),
    ('forward', 'elementwise', 'copy'),  # no stack: the jax op's name
  ]
  assert [r['share'] for r in rows] == pytest.approx([0.6, 0.2, 0.2])
  assert '| 300.0 | 60.0% | forward | matmul |' in op_profile.markdown(rows)


def test_bad_flags_raise_before_compiling():
  with pytest.raises(ValueError, match='names one variant'):
    train_step.main(['--tiny', '--compare=--dtype=bfloat16'])
  with pytest.raises(ValueError, match='run flags'):
    train_step.main(['--tiny', '--compare=--repeats=3;--dtype=bfloat16'])
  with pytest.raises(ValueError, match='dtype'):
    train_step.main(['--tiny', '--compare=--dtype=float32;--dtype=f16'])


@pytest.mark.slow
def test_samplers_report_calls_tokens_and_the_python_loop_ratio():
  """Per T: a per-step Python loop, the same sampler jitted (md4's loop),
  the cached one with and without logits_at; NFE is exact (T uncached; at
  most min(T, L) cached). L = 32 so that logits_at applies (budget 16)."""
  T, L = 12, 32
  rows = samplers.main(
    [
      f'--steps={T}',
      f'--length={L}',
      '--batch=2',
      '--width=32',
      '--depth=1',
      '--heads=2',
      '--vocab=8',
      '--repeats=2',
      '--fixed=confidence:tokens_per_step=4',
    ]
  )
  by = {r['sampler']: r for r in rows}
  assert set(by) == {
    'baseline_python_loop',
    'ancestral_jit_no_cache',
    'ancestral_cached',
    'ancestral_cached_full_pass',
    'confidence:tokens_per_step=4',
  }
  assert by['baseline_python_loop']['nfe'] == T
  assert by['ancestral_jit_no_cache']['nfe'] == T
  assert 1 <= by['ancestral_cached']['nfe'] <= min(T, L)
  assert (
    by['ancestral_cached_full_pass']['nfe'] == by['ancestral_cached']['nfe']
  )
  assert by['confidence:tokens_per_step=4']['nfe'] == L // 4
  base = by['baseline_python_loop']['seconds']
  for r in rows:
    for k in ('seconds', 'seconds_median', 'ms_per_call', 'tokens_per_sec'):
      assert math.isfinite(r[k]) and r[k] > 0, (r['sampler'], k, r[k])
    assert r['ms_per_call'] == pytest.approx(1e3 * r['seconds'] / r['nfe'])
    assert r['tokens_per_sec'] == pytest.approx(2 * L / r['seconds'])
    if r['T'] and r['sampler'] != 'baseline_python_loop':
      assert r['speedup_vs_baseline'] == pytest.approx(base / r['seconds'])
  md4 = by['ancestral_jit_no_cache']['seconds']
  cached = ('ancestral_cached', 'ancestral_cached_full_pass')
  for name in cached:
    assert by[name]['speedup_vs_md4_loop'] == pytest.approx(
      md4 / by[name]['seconds']
    )
  others = [r for r in rows if r['sampler'] not in cached]
  assert all(r['speedup_vs_md4_loop'] is None for r in others)
  assert '| ancestral_jit_no_cache | 12 | 12 |' in samplers.table(rows)
