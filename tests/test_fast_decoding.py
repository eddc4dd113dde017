"""The Fast-dLLM decoding benchmark: its records and verdicts, and a smoke
run on the quickstart smoke model with an AR smoke scorer."""

import json
import os

import pytest

from experiments import claims as registry
from experiments.benchmarks import fast_decoding
from experiments.claims import records
from experiments.claims import verdict as verdict_lib


def _result(seed, tpc, ratio, speedup, cache_ratio):
  one = {'tokens_per_call': 1.0, 'gen_nll_matched': 5.0}
  return {
    'workdir': f'runs/s{seed}',
    'seed': seed,
    'threshold': {
      'length': 256,
      'one_per_call': one,
      'threshold_0.9': {'tokens_per_call': tpc, 'gen_nll_matched': 5 * ratio},
      'gen_nll_ratio': ratio,
    },
    'cache': {
      'length': 512,
      'none': {'gen_nll_matched': 5.0},
      'dual': {
        'gen_nll_matched': 5 * cache_ratio,
        'meter': {'kl_mean': 1e-3, 'kl_max': 0.1},
      },
      'gen_nll_ratio': cache_ratio,
      'timing': {
        'speedup': speedup,
        'dual_tokens_per_sec': 100.0 * speedup,
        'none_tokens_per_sec': 100.0,
      },
    },
    'load_average': (1.0, 1.0, 1.0),
    'settings': {'temperatures': [0.9, 1.0]},
  }


def _verdicts(results):
  out = {}
  for record in fast_decoding.claim_records(results, 'cmd', '.'):
    records.validate(record)
    claim = registry.CLAIMS[record['claim']]
    out[record['claim']] = verdict_lib.judge(claim.rule, record).label
  return out


def test_records_carry_one_value_per_training_seed_and_judge_each_claim():
  results = [_result(s, 3.5, 1.01, 2.5, 1.0) for s in (0, 1, 2)]
  verdicts = _verdicts(results)
  assert set(verdicts) == set(fast_decoding._CLAIM_IDS)
  assert set(verdicts.values()) == {verdict_lib.REPRODUCED}
  record = fast_decoding.claim_records(results, 'cmd', '.')[2]
  assert record['arms']['speedup']['values'] == [2.5, 2.5, 2.5]
  assert record['seeds'] == [0, 1, 2] and record['seed_kind'] == 'training'
  # One seed below a target makes that claim partial, a mean below a miss.
  mixed = [_result(0, 3.5, 1.01, 2.5, 1.0), _result(1, 3.5, 1.01, 2.5, 1.0)]
  mixed.append(_result(2, 2.5, 1.05, 1.5, 1.0))
  verdicts = _verdicts(mixed)
  assert verdicts['threshold-tokens-per-call'] == verdict_lib.PARTIAL
  assert verdicts['dual-cache-gen-nll'] == verdict_lib.REPRODUCED
  slow = [_result(s, 1.5, 1.2, 1.1, 1.0) for s in (0, 1, 2)]
  verdicts = _verdicts(slow)
  assert verdicts['dual-cache-speedup'] in (
    verdict_lib.MISS,
    verdict_lib.INCONCLUSIVE,
  )
  assert verdicts['threshold-gen-nll'] != verdict_lib.REPRODUCED
  # A threshold that never fired leaves no quality record: its samples are
  # those of one token per call, so the ratio would pass by construction.
  idle = [_result(s, 1.0, 1.0, 2.5, 1.0) for s in (0, 1, 2)]
  assert 'threshold-gen-nll' not in _verdicts(idle)
  assert _verdicts(idle)['threshold-tokens-per-call'] in (
    verdict_lib.MISS,
    verdict_lib.INCONCLUSIVE,
  )


def test_bad_arguments_are_refused_before_loading(tmp_path, capsys):
  missing = str(tmp_path / 'none')
  for argv, text in (
    ([f'--workdir={missing}', '--repeats=0'], '--repeats'),
    ([f'--workdir={missing}', '--cache_length=100'], 'multiple of'),
    ([f'--workdir={missing}', '--temperatures=0,1'], 'positive'),
    ([f'--workdir={missing}'], 'not a run directory'),
  ):
    with pytest.raises(SystemExit) as err:
      fast_decoding.main(argv)
    assert err.value.code == 2
    assert text in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_run_measures_both_parts(smoke_mdlm_run, tmp_path):
  from ddlm_jax.tasks import language_model as lm
  from experiments.configs import ar_quickstart

  ar = ar_quickstart.get_config('smoke')
  ar.sample.num_samples = 0
  ar.mesh.shape = (1, 1, 1)
  scorer = str(tmp_path / 'ar')
  lm.train_and_evaluate(ar, scorer)
  workdir, _ = smoke_mdlm_run
  out = str(tmp_path / 'out')
  (result,) = fast_decoding.main([
    f'--workdir={workdir}', f'--scorer={scorer}', '--num_samples=2',
    '--cache_samples=2', '--threshold_length=16', '--cache_length=64',
    '--repeats=1', '--temperatures=0.9,1.0', f'--out={out}',
  ])  # fmt: skip
  thr = result['threshold']
  assert thr['one_per_call']['nfe'] == 16  # threshold 1.0: T = L
  assert thr['one_per_call']['tokens_per_call'] == 1.0
  assert thr['threshold_0.9']['nfe'] <= 16
  cache = result['cache']
  assert cache['dual']['meter']['cache_kind'] == 'approximate'
  assert cache['dual']['meter']['kl_mean'] >= 0
  # The floor of CACHE_FLOOR tokens per call bounds the calls per block.
  blocks = 64 // fast_decoding.BLOCK
  most = blocks * -(-fast_decoding.BLOCK // fast_decoding.CACHE_FLOOR)
  assert cache['none']['nfe'] <= most
  timing = cache['timing']
  assert timing['none_nfe'] >= 64 // fast_decoding.BLOCK  # one per block
  assert timing['speedup'] > 0 and timing['dual_nfe'] >= blocks
  # The dual cache's window calls read 32 of 64 positions: less work.
  assert cache['dual']['flops_per_sample'] < cache['none']['flops_per_sample']
  assert cache['gen_nll_ratio'] > 0 and thr['gen_nll_ratio'] > 0
  for part in ('threshold_16', 'cache_64'):
    assert 'frontier.png' in os.listdir(os.path.join(out, 's0', part))
  saved = json.loads(open(os.path.join(out, 'fast_decoding.json')).read())
  assert saved[0]['seed'] == 0
  # The file `experiments.reproduce` reads each claim's numbers from.
  for claim in ('threshold-tokens-per-call', 'dual-cache-speedup'):
    got = registry.CLAIMS[claim].measurement.value(saved)
    assert all(x > 0 for x in got.values()), (claim, got)
  # The same run and settings are read back, not measured again.
  argv = [f'--workdir={workdir}', f'--scorer={scorer}', '--num_samples=2',
          '--cache_samples=2', '--threshold_length=16', '--cache_length=64',
          '--repeats=1', '--temperatures=0.9,1.0', f'--out={out}']  # fmt: skip
  (again,) = fast_decoding.main(argv)
  assert again == saved[0]
