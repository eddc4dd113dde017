"""Sample-quality claims at matched entropy: the interpolation, the record
arms it builds and their verdicts, spec checks, saved sweeps, and the smoke
budget of one claim end to end through `experiments.reproduce`."""

import json
import math
import os

import pytest

from ddlm_jax.errors import ConfigError
from experiments import claims as registry
from experiments import reproduce
from experiments.benchmarks import matched_sampling as ms
from experiments.claims import records, spec
from experiments.claims import verdict as verdict_lib

LN2 = math.log(2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _points(entropies, nlls, temps=(0.9, 1.0, 1.15)):
  return {
    t: {'entropy': h, 'gen_nll': v, 'nfe': 8.0, 'flops_per_sample': 1e6}
    for t, h, v in zip(temps, entropies, nlls)
  }


def test_matched_interpolates_inside_the_sweep_and_clips_outside():
  sweep = {
    1.0: {'entropy': 3.0, 'gen_nll': 3.5},
    1.2: {'entropy': 3.2, 'gen_nll': 3.9},
  }
  inside = ms.matched(sweep, 3.1)
  assert inside['gen_nll'] == pytest.approx(3.7)
  assert inside['gen_ppl'] == pytest.approx(math.exp(3.7))
  assert inside['entropy_bits'] == pytest.approx(3.1 / LN2)
  # Beyond the sweep: the nearest point, whose entropy is recorded (so a
  # verdict sees the mismatch instead of a target that was never reached).
  above = ms.matched(sweep, 3.5)
  assert above['gen_nll'] == pytest.approx(3.9)
  assert above['entropy_bits'] == pytest.approx(3.2 / LN2)
  # The order of the temperatures (string keys of a saved sweep) is not
  # the order of the entropies: a sampler may sharpen as it heats.
  shuffled = {'1.3': sweep[1.0], '0.8': sweep[1.2]}
  assert ms.matched(shuffled, 3.1)['gen_nll'] == pytest.approx(3.7)


def _record(claim, rows_by_arm, seeds):
  arms = {name: ms.arm_entry(rows, seeds) for name, rows in rows_by_arm.items()}
  record = records.start(claim.id, 'cmd', budget='cpu', seeds=seeds)
  record['arms'] = arms
  records.validate(record)
  return record


def test_a_sweep_reports_each_point_as_it_is_drawn(monkeypatch):
  """One progress line per temperature, in order, in bits and gen-ppl;
  the returned points are the draws, whatever the progress callback."""
  drawn = _points([4.0 * LN2, 4.5 * LN2], [math.log(20.0), math.log(30.0)])
  monkeypatch.setattr(ms, 'build', lambda name, params, t, scaled: t)
  monkeypatch.setattr(ms, 'draw', lambda run, t, **kw: drawn[t])
  run = type('Run', (), {'data': type('D', (), {'tokenizer': None})})()
  scorer = type('S', (), {'tokenizer': None})()
  lines = []
  points = ms.sweep(
    run,
    'x',
    {},
    (0.9, 1.0),
    num_samples=2,
    seed=0,
    scorer=scorer,
    progress=lines.append,
    label='psi seed 0',
  )
  assert points == drawn
  assert len(lines) == 2
  assert lines[0].startswith(
    'psi seed 0 sweep value 0.9 (1/2): entropy 4.000 bits, gen-ppl 20.00, '
  )
  assert lines[1].startswith('psi seed 0 sweep value 1 (2/2): entropy 4.500')
  assert (
    ms.sweep(run, 'x', {}, (0.9, 1.0), num_samples=2, seed=0, scorer=scorer)
    == drawn
  )


def test_records_of_matched_sweeps_judge_a_converted_claim():
  claim = registry.get('uniform-wins-few-steps')
  target = 3.05
  seeds = [0, 1, 2]

  def rows(nlls, entropies=(3.0, 3.1, 3.2)):
    return [ms.row(_points(entropies, nlls), target) for _ in seeds]

  better = {'udlm': rows((3.0, 3.2, 3.4)), 'mdlm': rows((3.5, 3.7, 3.9))}
  record = _record(claim, better, seeds)
  udlm = record['arms']['udlm']
  assert udlm['values'] == pytest.approx([math.exp(3.1)] * 3)
  assert udlm['entropy'] == pytest.approx([target / LN2] * 3)
  assert udlm['nfe'] == [8.0] * 3 and udlm['seeds'] == seeds
  got = verdict_lib.judge(claim.rule, record, claim.budget_fraction)
  assert got.label == verdict_lib.REPRODUCED, got.reason
  worse = {'udlm': better['mdlm'], 'mdlm': better['udlm']}
  got = verdict_lib.judge(claim.rule, _record(claim, worse, seeds))
  assert got.label == verdict_lib.MISS
  # A uniform sweep that never comes down to the target entropy is read
  # at its sharpest point: a lower gen-ppl bought with less entropy.
  sharp = {
    'udlm': rows((2.0, 2.2, 2.4), entropies=(2.6, 2.7, 2.8)),
    'mdlm': better['mdlm'],
  }
  got = verdict_lib.judge(claim.rule, _record(claim, sharp, seeds))
  assert got.label == verdict_lib.PARTIAL and 'entropy' in got.reason


def test_converted_claims_sample_the_bound_claims_runs():
  """Every trained arm of a sampling claim is a run some bound claim trains
  too (same directory), so the samples come from the runs whose bounds
  the records report; the scorer is the AR arm of ar-below-mdlm (its BPE
  twin for word-level claims). A model-scheduling light network is the
  one arm trained for sampling alone; a ratio of FLOPs needs no entropy
  match."""
  trained = {
    (arm.config, arm.overrides): reproduce.arm_key(arm, 'cpu', claim)
    for claim in registry.CLAIMS.values()
    if claim.arms and not claim.samplings
    for arm in claim.arms
  }
  ar = registry.get('ar-below-mdlm')
  ar_key = next(
    reproduce.arm_key(a, 'cpu', ar) for a in ar.arms if a.name == 'ar'
  )
  converted = [c for c in registry.CLAIMS.values() if c.samplings]
  assert {c.id for c in converted} >= {
    'remdm-capped-beats-ancestral',
    'remdm-loop-beats-ancestral',
    'uniform-wins-few-steps',
    'psi-beats-ancestral',
    'loo-conversion',
    'dgemma-samples-vs-bd3',
    'did-beats-block',
    'bd3-samples-beat-mdlm',
    'bd3-longer-than-training',
    'psi-keeps-improving',
    'sm-gen-ppl',
    'scheduling-middle-most-sensitive',
    'scheduling-middle-most-sensitive-bpe',
    'scheduling-saves-flops',
  }
  for claim in converted:
    ms.check(claim)  # Every sampler takes its params and a temperature.
    assert claim.command == f'python -m experiments.reproduce {claim.id}'
    names = {s.name for s in claim.samplings}
    rules = getattr(claim.rule, 'rules', (claim.rule,))
    for rule in rules:
      assert {rule.arm, rule.baseline} <= names, claim.id
      if getattr(rule, 'field', 'values') == 'values':
        assert rule.entropy_tol == spec.ENTROPY_TOL
    lights = {s.light for s in claim.samplings}
    for arm in claim.arms:
      if arm.name in lights:
        assert ('model.depth', 2) in arm.overrides, claim.id
        continue
      key = reproduce.arm_key(arm, 'cpu', claim)
      assert trained.get((arm.config, arm.overrides)) == key, (claim.id, key)
    scorer = reproduce.arm_key(claim.scorer, 'cpu', claim)
    if claim.family == 'word level':
      assert scorer.startswith('ar_quickstart_bpe-'), claim.id
    else:
      assert scorer == ar_key, claim.id
    for s in claim.samplings:
      assert 32 <= s.num_samples <= 64 and len(s.temperatures) >= 3


def test_bad_sampling_specs_are_refused_with_one_line():
  with pytest.raises(ValueError, match='temperature is swept'):
    spec.Sampling('a', 'm', 'ancestral', (('temperature', 0.9),))
  with pytest.raises(ValueError, match='at least two distinct'):
    spec.Sampling('a', 'm', 'ancestral', temperatures=(1.0,))
  with pytest.raises(ValueError, match='num_samples'):
    spec.Sampling('a', 'm', 'ancestral', num_samples=1)
  base = registry.get('uniform-wins-few-steps')
  orphan = spec.Sampling('x', 'nowhere', 'ancestral')
  with pytest.raises(ValueError, match='unknown arm'):
    spec.Claim(**{**base.__dict__, 'samplings': (orphan,)})
  with pytest.raises(ValueError, match='need a scorer'):
    spec.Claim(**{**base.__dict__, 'scorer': None})
  typo = spec.Sampling('x', 'mdlm', 'remdm', (('etta', 0.04),))
  claim = spec.Claim(**{**base.__dict__, 'samplings': (typo,)})
  with pytest.raises(ConfigError, match='sampling x') as err:
    ms.check(claim)
  assert '\n' not in str(err.value)


def test_reproduce_refuses_a_bad_sampler_before_training(
  monkeypatch, tmp_path, capsys
):
  base = registry.get('uniform-wins-few-steps')
  bad = spec.Sampling('udlm', 'udlm', 'no_such_sampler')
  claim = spec.Claim(**{**base.__dict__, 'samplings': (bad,)})
  monkeypatch.setitem(registry.CLAIMS, claim.id, claim)
  runs = tmp_path / 'runs'
  argv = [claim.id, '--budget=smoke', f'--runs_dir={runs}']
  assert reproduce.main([*argv, f'--records_dir={tmp_path}']) == 2
  err = capsys.readouterr().err
  assert 'no_such_sampler' in err and len(err.strip().splitlines()) == 1
  assert not runs.exists()


def test_smoke_settings_and_shared_result_directories():
  capped = registry.get('remdm-capped-beats-ancestral')
  loop = registry.get('remdm-loop-beats-ancestral')
  ancestral = [s for s in capped.samplings if s.name == 'ancestral'][0]
  full = ms.settings_of(ancestral, 'cpu')
  assert full['temperatures'] == list(spec.TEMPERATURES)
  assert full['params'] == {'num_steps': 128, 'use_cache': False}
  smoke = ms.settings_of(ancestral, 'smoke')
  assert smoke['temperatures'] == [min(spec.TEMPERATURES), 1.3]
  assert smoke['num_samples'] == ms.SMOKE_SAMPLES
  # Both ReMDM claims read the one ancestral sweep; ReMDM's differ.
  dirs = {
    (c.id, s.name): ms.result_dir('out', 'k', ms.settings_of(s, 'cpu'))
    for c in (capped, loop)
    for s in c.samplings
  }
  assert dirs[(capped.id, 'ancestral')] == dirs[(loop.id, 'ancestral')]
  assert dirs[(capped.id, 'remdm')] != dirs[(loop.id, 'loop')]


def test_saved_sweeps_are_reused_without_loading_a_run(tmp_path):
  claim = registry.get('loo-conversion')
  seeds = (0, 1)
  runs = {'udlm': {s: (str(tmp_path / 'absent'), 'udlm-key') for s in seeds}}
  scorer = (str(tmp_path / 'absent_ar'), 'ar-key/s0')
  out = str(tmp_path / 'samples')
  for sampling in claim.samplings:
    settings = ms.settings_of(sampling, 'cpu')
    for seed in seeds:
      nll = 3.0 + seed + (0.5 if sampling.name == 'plugin' else 0.0)
      saved = {
        'settings': settings,
        'run': f'udlm-key/s{seed}',
        'scorer': 'ar-key/s0',
        'target_entropy_nats': 3.05,
        'sweep': {
          str(t): v for t, v in _points((3.0, 3.1), (nll, nll)).items()
        },
      }
      file = ms.seed_results.path(
        ms.result_dir(out, 'udlm-key', settings), seed
      )
      ms.seed_results.save(file, saved)
  got = ms.measure_claim(
    claim, seeds, runs, scorer, out, budget='cpu', log=lambda _: None
  )
  assert got['arms']['exact']['values'] == pytest.approx(
    [math.exp(3.0), math.exp(4.0)]
  )
  assert got['arms']['plugin']['values'][0] == pytest.approx(math.exp(3.5))
  assert got['target_entropy_bits'] == pytest.approx([3.05 / LN2] * 2)
  # Another scorer is another measurement: nothing saved matches, so the
  # (absent) run would be loaded.
  with pytest.raises(Exception, match='absent'):
    ms.measure_claim(
      claim, seeds, runs, (scorer[0], 'other/s0'), out, budget='cpu'
    )


@pytest.mark.slow
def test_reproduce_smoke_samples_a_converted_claim_and_reuses(tmp_path):
  runs = tmp_path / 'runs'
  argv = [
    'uniform-wins-few-steps',
    '--budget=smoke',
    '--seeds=0',
    f'--runs_dir={runs}',
    f'--records_dir={tmp_path / "records"}',
  ]
  assert reproduce.main(argv) == 0
  (file,) = (tmp_path / 'records').iterdir()
  rec = json.loads(file.read_text())
  assert rec['budget'] == 'smoke' and rec['seed_kind'] == spec.TRAINING
  assert set(rec['arms']) == {'udlm', 'mdlm'}
  for arm in rec['arms'].values():
    assert arm['seeds'] == [0] and math.isfinite(arm['values'][0])
    assert arm['values'][0] > 1 and 0 < arm['entropy'][0] < 16
    assert arm['nfe'][0] <= 4
  assert set(rec['trained']) == {'mdlm', 'udlm'}
  assert len(rec['target_entropy_bits']) == 1
  assert 'uniform_ancestral:num_steps=4' in rec['notes']
  samples = runs / 'smoke' / 'samples'
  assert len(list(samples.iterdir())) == 2  # One sweep per sampling arm.
  # Again: every run and sweep is reused, the same numbers recorded.
  assert reproduce.main(argv) == 0
  again = [f for f in (tmp_path / 'records').iterdir() if f != file]
  rec2 = json.loads(again[0].read_text())
  assert rec2['arms'] == rec['arms']


def test_scaled_sweep_multiplies_a_self_annealing_samplers_schedule():
  claim = registry.get('dgemma-samples-vs-bd3')
  canvas = [s for s in claim.samplings if s.name == 'dgemma'][0]
  params = dict(canvas.params)
  sampler = ms.build(canvas.sampler, params, 1.5, canvas.scaled)
  assert (sampler.t_max, sampler.t_min) == pytest.approx((1.2, 0.6))
  assert sampler.temperature == 1.0 and sampler.num_steps == 48
  # Without `scaled` the sweep value is the temperature, which this
  # sampler refuses: check() catches it before anything trains.
  plain = spec.Sampling('c', 'dgemma', canvas.sampler, canvas.params)
  with pytest.raises(ConfigError, match='sampling c'):
    ms.check(spec.Claim(**{**claim.__dict__, 'samplings': (plain,)}))
  with pytest.raises(ValueError, match='not in params'):
    spec.Sampling('c', 'dgemma', canvas.sampler, (), scaled=('t_max',))


def test_settings_with_nested_params_match_after_a_save(tmp_path):
  """A saved sweep is reused only if its settings compare equal once read
  back from JSON, nested parameter pairs included."""
  claim = registry.get('dgemma-samples-vs-bd3')
  block = [s for s in claim.samplings if s.name == 'bd3'][0]
  settings = ms.settings_of(block, 'cpu')
  assert settings['params']['inner_params'] == [['num_steps', 16]]
  assert ms.build(block.sampler, settings['params'], 0.9).inner_params == (
    ('num_steps', 16),
  )
  file = str(tmp_path / 's0' / 'result.json')
  ms.seed_results.save(file, {'settings': settings})
  assert ms.seed_results.load_matching(file, settings=settings) is not None
  # The scaled params are part of the settings: another schedule, another
  # sweep directory.
  canvas = [s for s in claim.samplings if s.name == 'dgemma'][0]
  unscaled = spec.Sampling(
    'dgemma', 'dgemma', canvas.sampler, canvas.params,
    temperatures=canvas.temperatures, num_samples=canvas.num_samples,
  )  # fmt: skip
  assert ms.result_dir('o', 'k', ms.settings_of(canvas, 'cpu')) != (
    ms.result_dir('o', 'k', ms.settings_of(unscaled, 'cpu'))
  )


def _entropy_points(entropy_of, temps):
  return {
    float(t): {
      'entropy': entropy_of(t),
      'gen_nll': 2.0 * entropy_of(t),
      'nfe': 8.0,
      'flops_per_sample': 1e6,
    }
    for t in temps
  }


def test_a_sweep_short_of_the_target_goes_on_past_its_end():
  base = (0.9, 1.0, 1.15)
  points = _entropy_points(lambda t: 3.0 + t, base)  # 3.9 .. 4.15
  assert ms.next_value(points, 4.0, base) is None  # Inside: nothing to add.
  # Too little entropy: hotter, a factor past the hottest value, then from
  # the value added, at most EXTEND_POINTS past the sweep's end.
  hot = ms.next_value(points, 4.6, base)
  assert hot == pytest.approx(1.15 * ms.EXTEND_FACTOR)
  drawn = ms.extend(
    points, 9.0, base, lambda ts: _entropy_points(lambda t: 3.0 + t, ts)
  )
  assert len(drawn) == ms.EXTEND_POINTS
  assert drawn == pytest.approx(
    [1.15 * ms.EXTEND_FACTOR**k for k in range(1, ms.EXTEND_POINTS + 1)]
  )
  assert ms.next_value(points, 9.0, base) is None
  # Too much entropy: colder, below the coldest value.
  points = _entropy_points(lambda t: 3.0 + t, base)
  assert ms.next_value(points, 3.5, base) == pytest.approx(0.9 / 1.25)
  # A sampler whose entropy does not follow its temperature is drawn once
  # past the end and then left (its record shows the mismatch).
  flat = _entropy_points(lambda t: 4.0 + 0.01 * min(t, 1.15), base)
  drawn = ms.extend(
    flat,
    5.0,
    base,
    lambda ts: _entropy_points(lambda t: 4.0 + 0.01 * min(t, 1.15), ts),
  )
  assert len(drawn) == 1
  # The limit holds whatever next_value would ask.
  points = _entropy_points(lambda t: 3.0 + t, base)
  assert ms.extend(points, 9.0, base, lambda ts: 1 / 0, limit=0) == []


def test_a_claim_sweep_short_of_the_target_is_extended_once(
  tmp_path, monkeypatch
):
  """measure_claim reads a saved sweep that ends below the target, draws
  the values past its end (saved with it), reads the gen-NLL at the target
  and names the extension in the notes; a second call draws nothing and
  writes the same notes."""
  from ddlm_jax.evaluation import sample_metrics
  from ddlm_jax.tasks import language_model

  claim = registry.get('loo-conversion')
  seeds = (0,)
  entropy_of = lambda t: 2.0 + t  # noqa: E731
  calls = []

  def fake_sweep(run, name, params, temperatures, **kw):
    calls.append(list(temperatures))
    return _entropy_points(entropy_of, temperatures)

  monkeypatch.setattr(ms, 'sweep', fake_sweep)
  monkeypatch.setattr(language_model, 'load_run', lambda workdir: workdir)
  monkeypatch.setattr(
    sample_metrics.ARScorer, 'from_run', classmethod(lambda cls, run: run)
  )
  runs = {'udlm': {0: (str(tmp_path / 'run'), 'udlm-key')}}
  scorer = (str(tmp_path / 'ar'), 'ar-key/s0')
  out = str(tmp_path / 'samples')
  target = 2.0 + 1.6  # Past the hottest value (1.5), before 1.5 * 1.25.
  for sampling in claim.samplings:
    settings = ms.settings_of(sampling, 'cpu')
    assert entropy_of(max(settings['temperatures'])) < target
    file = ms.seed_results.path(ms.result_dir(out, 'udlm-key', settings), 0)
    ms.seed_results.save(
      file,
      {
        'settings': settings,
        'run': 'udlm-key/s0',
        'scorer': 'ar-key/s0',
        'target_entropy_nats': target,
        'sweep': {
          str(t): v
          for t, v in _entropy_points(
            entropy_of, settings['temperatures']
          ).items()
        },
      },
    )
  got = ms.measure_claim(
    claim, seeds, runs, scorer, out, budget='cpu', log=lambda _: None
  )
  assert calls and all(len(c) == 1 for c in calls)  # One value per draw.
  for name, arm in got['arms'].items():
    # Read at the target, where gen-NLL = 2 * entropy exactly.
    assert arm['entropy'][0] == pytest.approx(target / LN2)
    assert arm['values'][0] == pytest.approx(math.exp(2.0 * target))
    assert got['rows'][name][0]['extended']
  hottest = max(ms.settings_of(claim.samplings[0], 'cpu')['temperatures'])
  text = ms.notes(claim, got, 'cpu')
  assert 'past their end' in text
  assert f'seed 0 at {hottest * ms.EXTEND_FACTOR:.3g}' in text
  drawn = len(calls)
  again = ms.measure_claim(
    claim, seeds, runs, scorer, out, budget='cpu', log=lambda _: None
  )
  assert len(calls) == drawn  # The extension was saved with the sweep.
  assert again['arms'] == got['arms']
  assert ms.notes(claim, again, 'cpu') == text  # Named when reused too.
