"""The Fast-dLLM decoding benchmark: the verdicts its results give the four
claims (as `experiments.reproduce` records them), and a smoke run on the
quickstart smoke model with an AR smoke scorer."""

import json
import os

import pytest

from experiments import claims as registry
from experiments.benchmarks import fast_decoding
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
        'rows': 8,
        'repeats': 2,
        'speedup': speedup,
        'dual_tokens_per_sec': 100.0 * speedup,
        'none_tokens_per_sec': 100.0,
      },
    },
    'load_average': (1.0, 1.0, 1.0),
    'settings': {'temperatures': [0.9, 1.0]},
  }


_FAST = (
  'threshold-tokens-per-call',
  'threshold-gen-nll',
  'dual-cache-speedup',
  'dual-cache-gen-nll',
)


@pytest.fixture
def verdicts(judge_results):
  """{claim: verdict label} of the four claims from one result per seed,
  as `experiments.reproduce` records them; a claim whose value the
  results do not hold is left out."""

  def of(results):
    out = {}
    for claim in _FAST:
      try:
        _, got = judge_results(claim, [(r['seed'], [r]) for r in results])
      except ValueError:
        continue
      out[claim] = got.label
    return out

  return of


def test_records_carry_one_value_per_training_seed_and_judge_each_claim(
  verdicts, judge_results
):
  results = [_result(s, 3.5, 1.01, 2.5, 1.0) for s in (0, 1, 2)]
  assert verdicts(results) == dict.fromkeys(_FAST, verdict_lib.REPRODUCED)
  record, _ = judge_results(
    'dual-cache-speedup', [(r['seed'], [r]) for r in results]
  )
  assert record['arms']['speedup']['values'] == [2.5, 2.5, 2.5]
  assert record['seeds'] == [0, 1, 2] and record['seed_kind'] == 'training'
  # The notes say what the numbers were read at: the rule, the meter, load.
  assert 'blocks of 32, threshold 0.9 with at least 4 tokens' in record['notes']
  assert 'KL mean [0.001, 0.001, 0.001]' in record['notes']
  assert (
    'load average at the end of each seed: [1.0, 1.0, 1.0]' in (record['notes'])
  )
  # One seed below a target makes that claim partial, a mean below a miss.
  mixed = [_result(0, 3.5, 1.01, 2.5, 1.0), _result(1, 3.5, 1.01, 2.5, 1.0)]
  mixed.append(_result(2, 2.5, 1.05, 1.5, 1.0))
  got = verdicts(mixed)
  assert got['threshold-tokens-per-call'] == verdict_lib.PARTIAL
  assert got['dual-cache-gen-nll'] == verdict_lib.REPRODUCED
  slow = [_result(s, 1.5, 1.2, 1.1, 1.0) for s in (0, 1, 2)]
  got = verdicts(slow)
  assert got['dual-cache-speedup'] in (
    verdict_lib.MISS,
    verdict_lib.INCONCLUSIVE,
  )
  assert got['threshold-gen-nll'] != verdict_lib.REPRODUCED
  # A threshold that never fired leaves no quality record: its samples are
  # those of one token per call, so the ratio would pass by construction.
  idle = [_result(s, 1.0, 1.0, 2.5, 1.0) for s in (0, 1, 2)]
  assert 'threshold-gen-nll' not in verdicts(idle)
  assert verdicts(idle)['threshold-tokens-per-call'] in (
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
  # And the notes its record carries, from the same file.
  notes = registry.CLAIMS['dual-cache-speedup'].measurement.describe([saved])
  assert notes.startswith('Best of 1 alternating rounds on 2 rows')
  # The same run and settings are read back, not measured again.
  argv = [f'--workdir={workdir}', f'--scorer={scorer}', '--num_samples=2',
          '--cache_samples=2', '--threshold_length=16', '--cache_length=64',
          '--repeats=1', '--temperatures=0.9,1.0', f'--out={out}']  # fmt: skip
  (again,) = fast_decoding.main(argv)
  assert again == saved[0]
