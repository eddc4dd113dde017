"""Claims measured by their own command: timing benchmarks and sweeps.

A claim with a ``spec.Measurement`` has no ``experiments.run`` arms:
``experiments.reproduce`` runs its command in fresh processes and reads
the claim's numbers from each process's JSON. A timing benchmark trains
nothing and its processes are the replicates; a training sweep runs once
per seed. Checked here: the verdict rules count fresh processes (and only
those, besides training seeds), every registered benchmark writes the JSON
its claims read, and the reproduce command runs, records and reuses
processes, for a benchmark and for a sweep whose claims share it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys

import pytest

from experiments import claims as registry
from experiments import reproduce
from experiments.claims import block, planning, project, spec
from experiments.claims import verdict as v

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK_CLAIMS = [
  c
  for c in registry.CLAIMS.values()
  if c.measurement and not c.measurement.per_seed
]


def _record(values, kind):
  arm = {'values': list(values), 'seeds': list(range(len(values)))}
  return {'arms': {'a': arm}, 'seed_kind': kind}


def test_fresh_processes_count_as_replicates_and_rounds_do_not():
  rule = v.Threshold('a', 2.0, '>=')
  got = v.judge(rule, _record([2.3, 2.1, 2.6], spec.PROCESSES))
  assert got.label == v.REPRODUCED
  assert 'met on all 3 fresh processes' in got.reason
  rounds = v.judge(rule, _record([2.3, 2.1, 2.6], spec.ROUNDS))
  assert rounds.label == v.PARTIAL and 'not training seeds' in rounds.reason
  one = v.judge(rule, _record([2.3], spec.PROCESSES))
  assert one.label == v.PARTIAL and '1 fresh process, 3 needed' in one.reason
  slow = v.judge(rule, _record([2.3, 1.9, 2.6], spec.PROCESSES))
  assert slow.label == v.PARTIAL and 'met on 2 of 3' in slow.reason
  assert v.judge(rule, _record([1.3, 1.9, 1.6], spec.PROCESSES)).label == (
    v.MISS
  )
  better = v.Compare('a', 'b', 'higher')
  paired = _record([2.0, 2.1, 2.2], spec.PROCESSES)
  paired['arms']['b'] = {'values': [1.0, 1.1, 1.0], 'seeds': [0, 1, 2]}
  got = v.judge(better, paired)
  assert got.label == v.REPRODUCED and '3 fresh processes' in got.reason


def test_benchmark_claims_train_nothing_and_reproduce_by_their_id():
  assert {c.id for c in BENCHMARK_CLAIMS} >= {
    'train-step-mfu',
    'sampler-speed-vs-md4-256',
    'sampler-speed-vs-md4-1024',
    'scan-associative-vs-sequential',
    'pd-scan-vs-dense',
    'bd3-kv-cache-speedup',
  }
  for claim in BENCHMARK_CLAIMS:
    assert not claim.arms and not claim.accelerator
    assert claim.command == f'python -m experiments.reproduce {claim.id}'
    assert claim.measurement.arm in repr(claim.rule)
    assert claim.measurement.processes >= 3
  base = BENCHMARK_CLAIMS[0]
  with pytest.raises(ValueError, match='trains only the arms'):
    dataclasses.replace(base, arms=(spec.Arm('x', 'c.py'),))


def test_value_functions_read_the_claimed_row():
  rows = [
    {'sampler': 'ancestral_cached', 'T': 256, 'speedup_vs_md4_loop': 2.5},
    {'sampler': 'ancestral_cached', 'T': 1024, 'speedup_vs_md4_loop': 4.0},
    {'sampler': 'ancestral_jit_no_cache', 'T': 256, 'speedup_vs_md4_loop': 0},
  ]
  assert project.cached_vs_md4(rows, 256) == 2.5
  assert project.cached_vs_md4(rows, 1024) == 4.0
  scans = {
    'linear': [
      {'L': 256, 'sequential_over_associative': 0.1},
      {'L': 1024, 'sequential_over_associative': 1.4},
      {'L': 4096, 'sequential_over_associative': 0.9},
    ],
    'pd': [{'N': 16, 'dense_over_pd': 5.0}, {'N': 64, 'dense_over_pd': 40.0}],
  }
  # "No slower at L >= 1024" must hold at every such shape: the minimum.
  assert project.associative_at_long(scans) == 0.9
  assert project.dense_over_pd(scans) == 40.0
  with pytest.raises(ValueError, match='no length >= 1024'):
    project.associative_at_long({'linear': scans['linear'][:1]})
  assert project.mfu_percent({'variants': [{'mfu': 0.61}]}) == 61.0
  lengths = [
    {'length': 512, 'speedup': 20.0, 'same_tokens': True},
    {'length': 1024, 'speedup': 60.0, 'same_tokens': True},
  ]
  assert block.kv_cache_speedup(lengths) == 60.0
  lengths[1]['same_tokens'] = False
  with pytest.raises(ValueError, match='samples differ'):
    block.kv_cache_speedup(lengths)


def _commands():
  """One smoke run per distinct benchmark command (claims share them)."""
  out = {}
  for claim in BENCHMARK_CLAIMS:
    out.setdefault(claim.measurement.command('smoke'), []).append(claim)
  return list(out.values())


@pytest.mark.slow
@pytest.mark.parametrize(
  'claims', _commands(), ids=lambda cs: cs[0].measurement.module.split('.')[-1]
)
def test_each_benchmark_writes_the_json_its_claims_read(claims, tmp_path):
  """The contract between a benchmark's --json output and the claim's
  value function, run in this process at the smoke sizes."""
  bench = claims[0].measurement
  path = tmp_path / 'out.json'
  module = importlib.import_module(bench.module)
  module.main([*bench.args_for('smoke'), f'{bench.result_flag}={path}'])
  result = json.loads(path.read_text())
  for claim in claims:
    value = claim.measurement.value(result)
    assert math.isfinite(value) and value > 0, (claim.id, value)


def _tiny_claim() -> spec.Claim:
  """bd3-kv-cache-speedup with two processes at the smoke sizes."""
  claim = registry.get('bd3-kv-cache-speedup')
  return dataclasses.replace(
    claim, measurement=dataclasses.replace(claim.measurement, processes=2)
  )


@pytest.mark.slow
def test_reproduce_times_fresh_processes_records_and_reuses_them(tmp_path):
  claim = _tiny_claim()
  runs, recs = str(tmp_path / 'runs'), str(tmp_path / 'records')
  lines = []
  record, got, path = reproduce.reproduce(
    claim, (), 'smoke', runs, recs, 'cmd', log=lines.append
  )
  assert record['seed_kind'] == spec.PROCESSES
  assert record['seeds'] == [0, 1]
  values = record['arms']['cached']['values']
  assert len(values) == 2 and all(x > 0 for x in values)
  assert 'reused_seeds' not in record['arms']['cached']
  assert (
    'fresh processes of `python -m experiments.benchmarks' in (record['notes'])
  )
  assert got.label == v.INCONCLUSIVE  # The smoke budget never settles.
  out_dir = reproduce.measure_dir(claim.measurement, 'smoke', runs)
  files = sorted(os.listdir(out_dir))
  assert files == ['p0.json', 'p1.json']
  assert [line.split(':')[0] for line in lines] == ['  p0', '  p1']
  # A second call reads the finished processes and starts none.
  stamps = {f: os.stat(os.path.join(out_dir, f)).st_mtime_ns for f in files}
  lines.clear()
  again, _, _ = reproduce.reproduce(
    claim, (), 'smoke', runs, recs, 'cmd', log=lines.append
  )
  assert len(lines) == 2 and all('finished, reused' in x for x in lines)
  assert stamps == {
    f: os.stat(os.path.join(out_dir, f)).st_mtime_ns for f in files
  }
  assert again['arms']['cached']['values'] == values
  assert again['arms']['cached']['reused_seeds'] == [0, 1]
  # The first call's notes give the load before each process it ran; the
  # second ran none and says so.
  assert 'load average before each process run here: [' in record['notes']
  assert again['notes'].endswith(
    'every result was reused from an earlier call.'
  )
  with open(path) as f:
    assert json.load(f)['arms'] == record['arms']


def test_a_failed_process_leaves_no_result_and_names_the_retry(
  tmp_path, monkeypatch
):
  claim = _tiny_claim()
  monkeypatch.setattr(
    reproduce.subprocess,
    'run',
    lambda *a, **k: subprocess.CompletedProcess(a, 1),
  )
  with pytest.raises(
    RuntimeError,
    match='p0 of experiments.benchmarks.block_sampling failed .*exit 1',
  ):
    reproduce.measure_command(claim, (), 'smoke', str(tmp_path), print)
  out_dir = reproduce.measure_dir(claim.measurement, 'smoke', str(tmp_path))
  assert os.listdir(out_dir) == []


def test_seeds_are_refused_for_a_timing_claim():
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.reproduce',
      'pd-scan-vs-dense',
      '--seeds=0,1,2',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert out.returncode == 2
  assert 'drop --seeds' in out.stderr and out.stderr.count('\n') == 1


def test_a_measurement_names_its_seed_exactly_when_it_runs_per_seed():
  with pytest.raises(ValueError, match='lack'):
    spec.Measurement('m', ('--a',), 'x', float, per_seed=True)
  with pytest.raises(ValueError, match='hold'):
    spec.Measurement('m', ('--seeds={seed}',), 'x', float)
  sweep = registry.get('pe-latent-beats-text-arithmetic').measurement
  assert sweep.seed_kind == spec.TRAINING
  assert '--seeds=2' in sweep.args_for('cpu', 2)
  assert '--preset=smoke' in sweep.args_for('smoke', 0)
  results = {
    'latent': [{'accuracy_train_levels': 0.5}],
    'text': [{'accuracy_train_levels': 0.25}],
  }
  assert planning.pe_accuracy(results, ('latent', 'text')) == {
    'latent': 50.0,
    'text': 25.0,
  }


def test_claims_on_one_task_share_its_sweep():
  by_task = {}
  for claim in registry.CLAIMS.values():
    m = claim.measurement
    if m and m.module == 'experiments.sweep_planner_executor':
      by_task.setdefault(m.command(), []).append(claim.id)
  assert sorted(map(len, by_task.values())) == [1, 2, 2, 3]
  assert ['pe-latent-beats-text-arithmetic', 'pe-hybrid-vs-cot-arithmetic'] in (
    list(by_task.values())
  )
  assert [
    'pe-latent-beats-text-countdown',
    'mdm-beats-ar-countdown',
  ] in list(by_task.values())


def test_mdm_claims_read_valid_plans_at_their_level():
  def summary(share1, share2):
    levels = {'1': {'plan_accuracy': share1}, '2': {'plan_accuracy': share2}}
    return [{'per_level': levels}]

  results = {'text': summary(0.5, 0.25), 'cot': summary(0.75, 0.125)}
  sudoku = registry.get('mdm-beats-ar-sudoku').measurement
  countdown = registry.get('mdm-beats-ar-countdown').measurement
  assert sudoku.value(results) == {'mdm': 50.0, 'ar': 75.0}
  assert countdown.value(results) == {'mdm': 25.0, 'ar': 12.5}
  results['cot'] = summary(None, None)  # A pipeline that writes no plan
  with pytest.raises(ValueError, match='no plan'):
    sudoku.value(results)


@pytest.mark.slow
def test_a_sweep_claim_trains_once_per_seed_and_its_sibling_reuses_it(
  tmp_path,
):
  runs, recs = str(tmp_path / 'runs'), str(tmp_path / 'records')
  first = registry.get('pe-latent-beats-text-arithmetic')
  lines = []
  record, got, _ = reproduce.reproduce(
    first, (0,), 'smoke', runs, recs, 'cmd', log=lines.append
  )
  assert record['seed_kind'] == spec.TRAINING and record['seeds'] == [0]
  assert set(record['arms']) == {'latent', 'text'}
  for arm in record['arms'].values():
    assert arm['seeds'] == [0] and 0 <= arm['values'][0] <= 100
  assert got.label == v.INCONCLUSIVE
  assert '--seeds=0' in lines[0] and '--preset=smoke' in lines[0]
  out_dir = reproduce.measure_dir(first.measurement, 'smoke', runs)
  assert os.path.exists(os.path.join(out_dir, 's0', 'results.json'))
  # The sibling claim reads the same seed's results without training.
  sibling = registry.get('pe-hybrid-vs-cot-arithmetic')
  lines.clear()
  again, _, _ = reproduce.reproduce(
    sibling, (0,), 'smoke', runs, recs, 'cmd', log=lines.append
  )
  assert lines == [f'  seed 0: finished, reused ({out_dir}/s0.json)']
  assert set(again['arms']) == {'text', 'cot'}
  assert again['arms']['text']['values'] == record['arms']['text']['values']
  assert again['arms']['cot']['reused_seeds'] == [0]


# ---------------------------------------------- benchmarks on trained runs --


def test_a_benchmark_on_runs_names_only_runs_the_claim_trains():
  claim = registry.get('dual-cache-speedup')
  m = claim.measurement
  assert m.runs == {'mdlm', 'scorer'} and m.seed_kind == spec.TRAINING
  args = m.args_for('cpu', 1, {'mdlm': 'R1', 'scorer': 'A0'})
  assert '--workdir=R1' in args and '--scorer=A0' in args
  assert not any('{' in a for a in args)
  with pytest.raises(ValueError, match=r"unknown arms \['other'\]"):
    dataclasses.replace(
      claim,
      measurement=dataclasses.replace(
        m, args=('--w={run:other}',), smoke_args=None
      ),
    )
  with pytest.raises(ValueError, match='give a scorer arm'):
    dataclasses.replace(claim, scorer=None)
  with pytest.raises(ValueError, match=r"not \['extra'\]"):
    dataclasses.replace(claim, arms=(*claim.arms, spec.Arm('extra', 'c.py')))
  with pytest.raises(ValueError, match='hold'):  # runs, yet not per seed
    spec.Measurement('m', ('--w={run:a}',), 'x', float)


def _fast_result(workdir, seed, tokens_per_call):
  """The JSON of experiments.benchmarks.fast_decoding for one seed."""
  return [
    {
      'workdir': workdir,
      'seed': seed,
      'settings': {'temperatures': [0.9, 1.0]},
      'load_average': [1.5, 1.0, 1.0],
      'threshold': {
        'length': 256,
        'one_per_call': {'tokens_per_call': 1.0, 'gen_nll_matched': 5.0},
        'threshold_0.9': {
          'tokens_per_call': tokens_per_call,
          'gen_nll_matched': 5.1,
        },
        'gen_nll_ratio': 5.1 / 5.0,
      },
      'cache': {
        'length': 512,
        'none': {'gen_nll_matched': 5.0},
        'dual': {
          'gen_nll_matched': 5.05,
          'meter': {'kl_mean': 0.01, 'kl_max': 0.5},
        },
        'gen_nll_ratio': 1.01,
        'timing': {
          'rows': 4,
          'repeats': 2,
          'speedup': 2.0 + seed,
          'dual_tokens_per_sec': 100.0 * (2 + seed),
          'none_tokens_per_sec': 100.0,
        },
      },
    }
  ]


def _finished_runs(claim, seeds, runs, budget='smoke') -> dict:
  """{(arm or 'scorer', seed): workdir} of finished runs of the arms and
  the scorer the claim's measurement reads (no training)."""
  arms = [(a.name, a, s) for a in claim.arms for s in seeds]
  if claim.scorer is not None and 'scorer' in claim.measurement.runs:
    arms.append(('scorer', claim.scorer, spec.SCORER_SEED))
  finished = {}
  for name, arm, seed in arms:
    workdir = reproduce.workdir_of(claim, arm, seed, budget, runs)
    os.makedirs(workdir)
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
      json.dump({'validation': {'bits_per_token': 6.0 + seed}}, f)
    finished[name, seed] = workdir
  return finished


def _fake_benchmark(monkeypatch, write):
  """Replaces the benchmark processes by `write(flags)` (git still runs)."""
  real_run = subprocess.run

  def fake_run(cmd, **kwargs):
    if cmd[0] != sys.executable:  # git, for the record's commit
      return real_run(cmd, **kwargs)
    write(cmd[2], dict(a[2:].split('=', 1) for a in cmd[3:] if '=' in a))
    return subprocess.CompletedProcess(cmd, 0)

  monkeypatch.setattr(reproduce.subprocess, 'run', fake_run)


def test_reproduce_trains_the_runs_a_benchmark_reads_then_runs_it_per_seed(
  tmp_path, monkeypatch
):
  """The arms and the scorer are trained (here: finished runs, reused),
  the benchmark runs once per seed on that seed's run, a sibling claim
  reuses its processes, and a result without the claim's value fails."""
  claim = registry.get('dual-cache-speedup')
  runs, recs = str(tmp_path / 'runs'), str(tmp_path / 'records')
  finished = _finished_runs(claim, (0, 1), runs)
  calls = []

  def write(module, flags):
    seed = int(flags['workdir'][-1])
    assert flags['workdir'] == finished['mdlm', seed]
    assert flags['scorer'] == finished['scorer', spec.SCORER_SEED]
    assert module == 'experiments.benchmarks.fast_decoding'
    os.makedirs(flags['out'])
    with open(os.path.join(flags['out'], 'fast_decoding.json'), 'w') as f:
      json.dump(_fast_result(flags['workdir'], seed, 1.0), f)
    calls.append(seed)

  _fake_benchmark(monkeypatch, write)
  lines = []
  record, _, _ = reproduce.reproduce(
    claim, (0, 1), 'smoke', runs, recs, 'cmd', log=lines.append
  )
  assert calls == [0, 1]
  assert record['seed_kind'] == spec.TRAINING and record['seeds'] == [0, 1]
  assert record['trained']['mdlm']['values'] == [6.0, 7.0]
  assert record['trained']['mdlm']['reused_seeds'] == [0, 1]
  assert record['arms']['speedup']['values'] == [2.0, 3.0]
  assert '{run:mdlm} = quickstart_bpe' in record['notes']
  # The claim's own notes first, then how its processes ran.
  assert record['notes'].startswith('Best of 2 alternating rounds on 4 rows')
  assert (
    '(approximate). 1-minute load average at the end of each seed: '
    '[1.5, 1.5]. One process per training seed' in record['notes']
  )
  assert '{scorer} = ar_quickstart_bpe' in record['notes']
  # The sibling claim reads the same processes without running any.
  sibling = registry.get('dual-cache-gen-nll')
  again, _, _ = reproduce.reproduce(
    sibling, (0, 1), 'smoke', runs, recs, 'cmd', log=lines.append
  )
  assert calls == [0, 1]
  assert again['arms']['gen-NLL ratio']['values'] == [1.01, 1.01]
  # threshold 0.9 never fired: its quality ratio is 1 by construction.
  with pytest.raises(RuntimeError, match='by construction'):
    reproduce.reproduce(
      registry.get('threshold-gen-nll'), (0, 1), 'smoke', runs, recs, 'cmd'
    )
  # Another arm config is another measurement: nothing stale is reused.
  other = dataclasses.replace(
    claim, arms=(dataclasses.replace(claim.arms[0], overrides=(('a', 1),)),)
  )
  assert reproduce.measure_dir(
    other.measurement, 'smoke', runs, other
  ) != reproduce.measure_dir(claim.measurement, 'smoke', runs, claim)


def test_a_benchmark_value_may_carry_the_entropy_a_rule_checks(
  tmp_path, monkeypatch
):
  """DDPD's gen-ppl comes with the entropy it was read at, per seed, so
  the matched-entropy rule can refuse a sharper winner."""
  from experiments.claims import ddpd

  claim = registry.get('ddpd-beats-ancestral-t32')
  runs, recs = str(tmp_path / 'runs'), str(tmp_path / 'records')
  finished = _finished_runs(claim, (0, 1, 2), runs, 'cpu')
  sharp = {'ddpd': 0.0}

  def write(module, flags):
    assert module == 'experiments.benchmarks.ddpd_compare'
    seed = int(flags['planner'][-1])
    assert flags['denoiser'].endswith(finished['mdlm', seed][-20:])
    rows = {
      arm: {
        'gen_ppl': ppl + seed,
        'entropy_bits': 4.40 - sharp.get(arm, 0.0),
        'nfe': 66,
        'flops_per_sample': 1e9,
      }
      for arm, ppl in (('ddpd', 30.0), ('ancestral', 34.0))
    }
    path = os.path.join(flags['out'], f's{seed}', 'result.json')
    os.makedirs(os.path.dirname(path))
    with open(path, 'w') as f:
      json.dump({
        'steps': {'32': rows, '64': rows},
        'planner': flags['planner'],
        'seed': seed,
        'target_entropy_bits': 4.4,
        'settings': {'temperatures': [0.9, 1.0], 'num_samples': 8},
      }, f)  # fmt: skip

  _fake_benchmark(monkeypatch, write)
  record, _, _ = reproduce.reproduce(claim, (0, 1, 2), 'cpu', runs, recs, 'c')
  arm = record['arms']['ddpd']
  assert arm['values'] == [30.0, 31.0, 32.0] and arm['nfe'] == [66] * 3
  assert arm['entropy'] == [4.40] * 3
  assert v.judge(claim.rule, record).label == v.REPRODUCED
  # Sharper DDPD samples: the same gen-ppl no longer settles the claim.
  sharp['ddpd'] = 0.1
  again = str(tmp_path / 'runs2')
  _finished_runs(claim, (0, 1, 2), again, 'cpu')
  record, _, _ = reproduce.reproduce(claim, (0, 1, 2), 'cpu', again, recs, 'c')
  got = v.judge(claim.rule, record)
  assert got.label == v.PARTIAL and 'less entropy' in got.reason
  assert ddpd.matched_arms(
    {'steps': {'64': {'ddpd': {'gen_ppl': 1.0, 'entropy_bits': 2.0,
                               'nfe': 130, 'flops_per_sample': 3.0}}}},
    64, ('ddpd',),
  ) == {'ddpd': {'value': 1.0, 'entropy': 2.0, 'nfe': 130,
                 'flops_per_sample': 3.0}}  # fmt: skip
