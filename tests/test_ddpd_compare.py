"""The DDPD comparison benchmark: matched entropy, the verdicts its results
give, and a smoke run with a smoke planner, denoiser and AR scorer."""

import math

import pytest

from experiments import claims as registry
from experiments.benchmarks import ddpd_compare
from experiments.claims import verdict as verdict_lib

LN2 = math.log(2)


def test_equal_nfe_counts_both_networks_and_the_final_pass():
  assert ddpd_compare.baseline_steps(32) == 66
  assert ddpd_compare.baseline_steps(64) == 130
  arms = ddpd_compare._arms_at(32)
  assert arms[0] == ('ddpd', 'ddpd', {'num_steps': 32, 'parallel': True}, True)
  ancestral = {'use_cache': False, 'num_steps': 66}
  assert ('ancestral', 'ancestral', ancestral, False) in arms


def test_saved_settings_resolve_the_samplers_defaults():
  """A result saved before a sampler default changed is measured again:
  the settings hold every field, not only the arm's own parameters."""
  got = ddpd_compare.resolved('ddpd', {'num_steps': 32, 'parallel': True})
  assert got['num_steps'] == 32 and got['parallel'] is True
  assert got['final_fill_prob'] == 0.05 and got['final_greedy'] is True
  assert got['temperature'] == 1.0


def _result(seed, ddpd_ppl, base_ppl, ddpd_h=3.1, base_h=3.1):
  def row(ppl, h, nfe):
    return {
      'gen_ppl': ppl,
      'gen_nll': math.log(ppl),
      'entropy_bits': h,
      'nfe': nfe,
      'flops_per_sample': 1e9,
    }

  steps = {}
  for t in (32, 64):
    nfe = 2 * (t + 1)
    steps[str(t)] = {
      'ddpd': row(ddpd_ppl, ddpd_h, nfe),
      'ancestral': row(base_ppl, base_h, nfe),
      'confidence': row(base_ppl + 1, base_h, nfe),
    }
  return {
    'planner': f'runs/p{seed}',
    'seed': seed,
    'target_entropy_bits': 3.1,
    'steps': steps,
    'settings': {'temperatures': [1.0, 1.2], 'num_samples': 8},
  }


_IDS = tuple(c for c in registry.CLAIMS if c.startswith('ddpd-beats-'))


def test_results_pair_planner_seeds_and_judge_the_four_claims(judge_results):
  """One result per planner seed, read as `experiments.reproduce` reads
  them (seed S: planner S with denoiser S)."""

  def verdicts(results):
    return {
      claim: judge_results(claim, [(r['seed'], r) for r in results])[1].label
      for claim in _IDS
    }

  assert len(_IDS) == 4
  better = [_result(s, 30.0 + s, 40.0 + s) for s in (0, 1, 2)]
  assert set(verdicts(better).values()) == {verdict_lib.REPRODUCED}
  worse = [_result(s, 45.0, 40.0) for s in (0, 1, 2)]
  assert set(verdicts(worse).values()) == {verdict_lib.MISS}
  # A sharper DDPD (lower entropy than the baseline) cannot reproduce.
  sharp = [_result(s, 30.0, 40.0, ddpd_h=2.9) for s in (0, 1, 2)]
  assert verdict_lib.REPRODUCED not in set(verdicts(sharp).values())
  record, _ = judge_results(
    'ddpd-beats-ancestral-t32', [(r['seed'], r) for r in better]
  )
  assert record['arms']['ddpd']['seeds'] == [0, 1, 2]
  assert record['arms']['ddpd']['entropy'] == [3.1, 3.1, 3.1]
  assert record['arms']['ddpd']['nfe'] == [66] * 3
  assert '(3.100 bits)' in record['notes']
  # The planner paths a result holds are the measuring machine's; the
  # record names its runs itself, relative to the repository.
  assert 'runs/p0' not in record['notes']
  assert 'past their end' not in record['notes']
  # A sweep taken past its end is named with the values it was drawn at.
  better[1]['steps']['32']['ddpd']['extended'] = [1.5, 1.875]
  record, _ = judge_results(
    'ddpd-beats-ancestral-t32', [(r['seed'], r) for r in better]
  )
  assert record['notes'].endswith(
    'past their end to reach the target: ddpd seed 1 T = 32 at 1.5, 1.88.'
  )


def test_bad_arguments_are_refused_before_loading(tmp_path):
  missing = str(tmp_path / 'none')
  base = [f'--planner={missing}', f'--denoiser={missing}']
  base.append(f'--scorer={missing}')
  for extra, text in (
    (['--steps=0'], 'positive'),
    (['--temperatures=1.0'], 'at least two'),
    (['--num_samples=1'], 'at least 2'),
    (['--extend_points=-1'], '0 (no extension)'),
    ([], 'not a trained run'),
  ):
    with pytest.raises(SystemExit) as err:
      ddpd_compare.main(base + extra)
    assert text in str(err.value)


@pytest.mark.slow
def test_smoke_compare_draws_every_arm_at_equal_nfe(smoke_mdlm_run, tmp_path):
  from ddlm_jax.tasks import language_model as lm
  from experiments.configs import ar_quickstart, ddpd

  def train(config, name):
    config.sample.num_samples = 0
    config.mesh.shape = (1, 1, 1)
    workdir = str(tmp_path / name)
    lm.train_and_evaluate(config, workdir)
    return workdir

  scorer = train(ar_quickstart.get_config('smoke'), 'ar')
  planner = train(ddpd.get_config('smoke'), 'planner')
  denoiser, _ = smoke_mdlm_run
  out = str(tmp_path / 'out')
  argv = [
    f'--planner={planner}', f'--denoiser={denoiser}', f'--scorer={scorer}',
    '--steps=4', '--temperatures=0.9,1.1', '--num_samples=2', f'--out={out}',
    '--extend_points=1',
  ]  # fmt: skip
  (result,) = ddpd_compare.main(argv)
  arms = result['steps']['4']
  assert arms['ddpd']['nfe'] == 2 * (4 + 1)
  for name in ddpd_compare.BASELINES:
    assert arms[name]['nfe'] <= ddpd_compare.baseline_steps(4)
    assert arms[name]['flops_per_sample'] > 0
  assert all(math.isfinite(a['gen_ppl']) for a in arms.values())
  # A sweep short of the target took at most one value past its end.
  for arm in arms.values():
    assert len(arm['sweep']) == 2 + len(arm['extended'])
    assert len(arm['extended']) <= 1
    for t in arm['extended']:
      assert t in (pytest.approx(1.1 * 1.25), pytest.approx(0.9 / 1.25))
  # The notes of the claims' records read the same result, and name no
  # path of this machine (the record names its runs relative to the
  # repository).
  notes = registry.CLAIMS[_IDS[0]].measurement.describe([result])
  assert '[0.9, 1.1] with 2 samples per point' in notes
  assert str(tmp_path) not in notes
  # A second identical call reads the saved result back.
  (again,) = ddpd_compare.main(argv)
  assert again['seconds'] == result['seconds']
