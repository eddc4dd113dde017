"""Claims registry, verdict rules, records and the reproduce command.

The rules are checked on synthetic records: every verdict is reachable and
every rule can fail. The registry is checked for complete claims, the
committed records for a computed verdict each, and docs/RESULTS.md for
being exactly what ``experiments.results_doc`` generates.
"""

import json
import os
import re
import subprocess
import sys
import types

import pytest

from experiments import claims as registry
from experiments.claims import records, spec
from experiments.claims import verdict as v

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rec(arms, **kw):
  return {'arms': arms, 'seed_kind': kw.pop('seed_kind', 'training'), **kw}


def _arm(values, **kw):
  return {'values': list(values), 'seeds': list(range(len(values))), **kw}


# Threshold ----------------------------------------------------------------


def test_threshold_reproduced_partial_and_miss():
  rule = v.Threshold('a', 3.25, '<=')
  good = _rec({'a': _arm([3.13, 3.10, 3.11])})
  assert v.judge(rule, good).label == v.REPRODUCED
  one_over = _rec({'a': _arm([3.13, 3.10, 3.30])})
  assert v.judge(rule, one_over).label == v.PARTIAL
  two_seeds = _rec({'a': _arm([3.13, 3.10])})
  assert v.judge(rule, two_seeds).label == v.PARTIAL
  assert v.judge(rule, _rec({'a': _arm([3.4, 3.3, 3.2])})).label == v.MISS


def test_threshold_direction_and_summary_records():
  rule = v.Threshold('a', 95.0, '>=')
  assert v.judge(rule, _rec({'a': _arm([99, 100, 99.5])})).label == (
    v.REPRODUCED
  )
  # A summary: the mean must clear the target by two standard errors.
  clear = _rec({'a': {'mean': 99.0, 'sd': 0.5, 'n': 3}})
  assert v.judge(rule, clear).label == v.REPRODUCED
  close = _rec({'a': {'mean': 96.0, 'sd': 3.0, 'n': 3}})
  assert v.judge(rule, close).label == v.PARTIAL


def test_sampling_seeds_and_rounds_never_reproduce():
  rule = v.Threshold('a', 2.0, '>=')
  for kind in (spec.SAMPLING, spec.ROUNDS):
    rec = _rec({'a': _arm([2.3, 2.2, 2.4, 2.5])}, seed_kind=kind)
    got = v.judge(rule, rec)
    assert got.label == v.PARTIAL
    assert 'not training seeds' in got.reason


# Compare -------------------------------------------------------------------


def test_compare_paired_reproduced_partial_miss():
  rule = v.Compare('sm', 'plain', 'lower')
  rec = _rec(
    {
      'sm': _arm([3.2553, 3.2580, 3.2583]),
      'plain': _arm([3.2583, 3.2604, 3.2614]),
    }
  )
  assert v.judge(rule, rec).label == v.REPRODUCED
  # One seed against the claim keeps it partial even when the mean agrees.
  mixed = _rec({'sm': _arm([3.0, 3.1, 3.3]), 'plain': _arm([3.2, 3.3, 3.2])})
  got = v.judge(rule, mixed)
  assert got.label == v.PARTIAL and 'not on every seed' in got.reason
  worse = _rec({'sm': _arm([3.3, 3.3, 3.3]), 'plain': _arm([3.2, 3.2, 3.2])})
  assert v.judge(rule, worse).label == v.MISS


def test_compare_noise_and_higher_is_better():
  rule = v.Compare('a', 'b', 'higher')
  # Every seed agrees but the gain is inside twice its standard error.
  noisy = _rec({'a': _arm([1.0, 1.5, 9.0]), 'b': _arm([0.9, 1.4, 1.0])})
  got = v.judge(rule, noisy)
  assert got.label == v.PARTIAL and 'standard error' in got.reason
  assert (
    v.judge(rule, _rec({'a': _arm([5, 6, 7]), 'b': _arm([1, 2, 3])})).label
    == v.REPRODUCED
  )


def test_all_of_is_its_weakest_part_with_every_reason():
  """'The middle hurts most' = the middle beats the first and the last."""
  rule = v.AllOf(
    (v.Compare('mid', 'early', 'higher'), v.Compare('mid', 'late', 'higher'))
  )
  arms = {
    'mid': _arm([9.0, 9.5, 9.2]),
    'early': _arm([5.0, 5.1, 5.3]),
    'late': _arm([6.0, 6.2, 6.1]),
  }
  both = v.judge(rule, _rec(arms))
  assert both.label == v.REPRODUCED and both.reason.count('mid vs') == 2
  # The middle beats the end but not the start: a miss of the claim.
  one = v.judge(rule, _rec({**arms, 'early': _arm([9.9, 9.8, 9.7])}))
  assert one.label == v.MISS and 'mid vs early' in one.reason
  noisy = v.judge(rule, _rec({**arms, 'late': _arm([8.9, 9.6, 9.1])}))
  assert noisy.label == v.PARTIAL
  assert v.judge(rule, _rec(arms, seed_kind=spec.SAMPLING)).label == (v.PARTIAL)
  missing = v.judge(rule, _rec({'mid': arms['mid'], 'late': arms['late']}))
  assert missing.label == v.NOT_RUN
  with pytest.raises(ValueError, match='two or more'):
    v.AllOf((v.Compare('a', 'b'),))


def test_compare_matched_entropy_caps_a_sharper_winner():
  rule = v.Compare('u', 'm', 'lower', entropy_tol=0.02)
  arms = {
    'u': _arm([55.5, 58.5, 60.3], entropy=4.25),
    'm': _arm([67.4, 68.2, 64.3], entropy=4.42),
  }
  got = v.judge(rule, _rec(arms))
  assert got.label == v.PARTIAL and 'entropy' in got.reason
  arms['u']['entropy'] = 4.41
  assert v.judge(rule, _rec(arms)).label == v.REPRODUCED
  # A winner with more entropy is not suspect.
  arms['u']['entropy'] = 4.6
  assert v.judge(rule, _rec(arms)).label == v.REPRODUCED
  del arms['u']['entropy']
  assert v.judge(rule, _rec(arms)).label == v.PARTIAL


def test_compare_higher_is_better_caps_a_mismatch_either_way():
  # Higher gen-ppl as damage (or MAUVE): a flatter arm is ahead for free.
  rule = v.Compare('middle', 'late', 'higher', entropy_tol=0.02)
  arms = {
    'middle': _arm([45.0, 46.0, 47.0], entropy=4.40),
    'late': _arm([40.0, 41.0, 40.5], entropy=4.40),
  }
  assert v.judge(rule, _rec(arms)).label == v.REPRODUCED
  arms['middle']['entropy'] = 4.50
  got = v.judge(rule, _rec(arms))
  assert got.label == v.PARTIAL and '0.100 bits more entropy' in got.reason
  arms['middle']['entropy'] = 4.30
  got = v.judge(rule, _rec(arms))
  assert got.label == v.PARTIAL and '0.100 bits less entropy' in got.reason


def test_a_miss_against_a_handicapped_arm_is_not_matched():
  # Lower is better: a flatter loser may lose by its entropy alone.
  rule = v.Compare('planned', 'ancestral', 'lower', entropy_tol=0.02)
  arms = {
    'planned': _arm([50.0, 49.0, 51.0], entropy=4.58),
    'ancestral': _arm([33.0, 33.5, 32.5], entropy=4.40),
  }
  got = v.judge(rule, _rec(arms))
  assert got.label == v.NOT_MATCHED
  assert 'not the claimed direction' in got.reason
  assert '0.180 bits more entropy' in got.reason
  # A sharper loser had every advantage: its miss stands.
  arms['planned']['entropy'] = 4.30
  assert v.judge(rule, _rec(arms)).label == v.MISS
  arms['planned']['entropy'] = 4.41
  assert v.judge(rule, _rec(arms)).label == v.MISS
  # Without entropies nothing says the arms were matched.
  del arms['planned']['entropy']
  got = v.judge(rule, _rec(arms))
  assert got.label == v.NOT_MATCHED and 'not recorded' in got.reason
  # Higher is better: a mismatch either way can decide it.
  up = v.Compare('planned', 'ancestral', 'higher', entropy_tol=0.02)
  arms['planned'] = _arm([30.0, 30.0, 30.0], entropy=4.30)
  assert v.judge(up, _rec(arms)).label == v.NOT_MATCHED
  arms['planned']['entropy'] = 4.41
  assert v.judge(up, _rec(arms)).label == v.MISS
  # Without a tolerance the rule does not ask for matched samples.
  plain = v.Compare('planned', 'ancestral', 'lower')
  arms['planned'] = _arm([50.0, 49.0, 51.0], entropy=4.58)
  assert v.judge(plain, _rec(arms)).label == v.MISS
  # Far below the paper's budget it is inconclusive either way.
  low = v.judge(rule, _rec(arms), budget_fraction=0.005)
  assert low.label == v.INCONCLUSIVE and 'not matched' in low.reason


def test_a_ratio_miss_against_a_handicapped_arm_is_not_matched():
  rule = v.Ratio('long', 'short', 1.25, '<=', entropy_tol=0.02)
  arms = {
    'long': _arm([70.0, 80.0, 70.0], entropy=4.50),
    'short': _arm([50.0, 60.0, 50.0], entropy=4.40),
  }
  got = v.judge(rule, _rec(arms))
  assert got.label == v.NOT_MATCHED and '0.100 bits more' in got.reason
  arms['long']['entropy'] = 4.30  # Sharper: the miss stands.
  assert v.judge(rule, _rec(arms)).label == v.MISS
  higher = v.Ratio('long', 'short', 2.0, '>=', entropy_tol=0.02)
  assert v.judge(higher, _rec(arms)).label == v.NOT_MATCHED
  arms['long']['entropy'] = 4.50  # Flatter helps a ratio that must be high.
  assert v.judge(higher, _rec(arms)).label == v.MISS


def test_all_of_ranks_not_matched_between_partial_and_miss():
  rule = v.AllOf(
    (
      v.Compare('a', 'b', 'lower', entropy_tol=0.02),
      v.Threshold('a', 60.0, '<='),
    )
  )
  arms = {
    'a': _arm([50.0, 49.0, 51.0], entropy=4.58),
    'b': _arm([33.0, 33.5, 32.5], entropy=4.40),
  }
  assert v.judge(rule, _rec(arms)).label == v.NOT_MATCHED
  arms['a']['values'] = [70.0, 71.0, 72.0]  # The threshold misses too.
  assert v.judge(rule, _rec(arms)).label == v.MISS


def test_compare_single_seed_uses_the_recorded_standard_errors():
  rule = v.Compare('a', 'b', 'lower')
  rec = _rec(
    {
      'a': {'values': [3.235], 'stderr': [0.009]},
      'b': {'values': [3.290], 'stderr': [0.013]},
    }
  )
  got = v.judge(rule, rec)
  assert got.label == v.PARTIAL and '1 training seed' in got.reason


# Ratio ----------------------------------------------------------------------


def test_ratio_is_judged_seed_by_seed_against_its_target():
  rule = v.Ratio('long', 'short', 1.25, '<=')
  arms = {
    'long': _arm([60.0, 66.0, 70.0]),
    'short': _arm([50.0, 60.0, 50.0]),
  }
  # 1.2, 1.1, 1.4: the mean 1.233 meets 1.25, seed 2 does not.
  got = v.judge(rule, _rec(arms))
  assert got.label == v.PARTIAL and 'met on 2 of 3' in got.reason
  assert 'long/short' in got.reason
  arms['long']['values'] = [55.0, 66.0, 60.0]  # 1.1, 1.1, 1.2
  assert v.judge(rule, _rec(arms)).label == v.REPRODUCED
  arms['long']['values'] = [70.0, 80.0, 70.0]  # Every ratio > 1.25.
  assert v.judge(rule, _rec(arms)).label == v.MISS
  higher = v.Ratio('long', 'short', 1.25, '>=')
  assert v.judge(higher, _rec(arms)).label == v.REPRODUCED


def test_ratio_of_another_per_seed_field():
  rule = v.Ratio('early', 'heavy', 0.83, field='flops_per_sample')
  arms = {
    'early': _arm([9.0, 9.0, 9.0], flops_per_sample=[70.0, 80.0, 75.0]),
    'heavy': _arm([8.0, 8.0, 8.0], flops_per_sample=[100.0, 100.0, 100.0]),
  }
  got = v.judge(rule, _rec(arms))
  assert got.label == v.REPRODUCED
  assert 'early/heavy flops_per_sample: mean 0.75' in got.reason
  del arms['heavy']['flops_per_sample']
  assert v.judge(rule, _rec(arms)).label == v.NOT_RUN


def test_ratio_needs_paired_seeds_and_matched_entropy():
  rule = v.Ratio('long', 'short', 1.25, '<=', entropy_tol=0.02)
  arms = {
    'long': _arm([55.0, 66.0, 60.0], entropy=4.40),
    'short': _arm([50.0, 60.0, 50.0], entropy=4.41),
  }
  assert v.judge(rule, _rec(arms)).label == v.REPRODUCED
  # Sharper long samples flatter a ratio that must stay low.
  arms['long']['entropy'] = 4.30
  got = v.judge(rule, _rec(arms))
  assert got.label == v.PARTIAL and 'long has 0.110 bits less' in got.reason
  arms['long']['entropy'] = 4.60  # Flatter long samples are not suspect.
  assert v.judge(rule, _rec(arms)).label == v.REPRODUCED
  del arms['long']['entropy']
  assert 'not recorded' in v.judge(rule, _rec(arms)).reason
  # Means without per-seed values, or other seeds, give no ratio at all.
  arms['short'] = {'mean': 50.0, 'n': 3, 'se': 1.0}
  assert v.judge(rule, _rec(arms)).label == v.NOT_RUN
  arms['short'] = {'values': [50.0, 60.0, 50.0], 'seeds': [1, 2, 3]}
  got = v.judge(rule, _rec(arms))
  assert got.label == v.NOT_RUN and 'same seeds' in got.reason


# Match, Ordering, ExactTest -------------------------------------------------


def test_match_within_and_outside_the_spreads():
  rule = v.Match('m', 90.4, 10.4)
  assert v.judge(rule, _rec({'m': _arm([84, 81, 88])})).label == (v.REPRODUCED)
  tight = v.Match('m', 52.2, 0.4)
  assert v.judge(tight, _rec({'m': _arm([47.0, 48.0, 49.0])})).label == (v.MISS)
  assert v.judge(rule, _rec({'m': _arm([84])})).label == v.PARTIAL
  # A wide spread makes any mean 'match': it is only partial.
  lstm = v.Match('m', 100.0, 0.0)
  got = v.judge(lstm, _rec({'m': _arm([49.4, 100.0, 48.2])}))
  assert got.label == v.PARTIAL and 'spread' in got.reason


def test_ordering_every_seed_means_only_and_wrong_order():
  rule = v.Ordering(('a', 'b', 'c'))
  ok = _rec({'a': _arm([1, 1, 1]), 'b': _arm([2, 2, 2]), 'c': _arm([3, 3, 3])})
  assert v.judge(rule, ok).label == v.REPRODUCED
  one_off = _rec(
    {'a': _arm([1, 1, 2.5]), 'b': _arm([2, 2, 2]), 'c': _arm([3, 3, 3])}
  )
  assert v.judge(rule, one_off).label == v.PARTIAL
  wrong = _rec(
    {'a': _arm([3, 3, 3]), 'b': _arm([2, 2, 2]), 'c': _arm([1, 1, 1])}
  )
  assert v.judge(rule, wrong).label == v.MISS


def test_exact_test_passes_fails_or_was_not_run():
  rule = v.ExactTest('tests/x.py::test_y')
  assert v.judge(rule, {'arms': {}, 'exact_test': {'passed': True}}).label == (
    v.REPRODUCED
  )
  assert v.judge(rule, {'arms': {}, 'exact_test': {'passed': False}}).label == (
    v.MISS
  )
  assert v.judge(rule, {'arms': {}}).label == v.NOT_RUN
  skipped = {'passed': False, 'tests': 4, 'skipped': 3, 'failures': 0}
  got = v.judge(rule, {'arms': {}, 'exact_test': skipped})
  assert got.label == v.NOT_RUN and '3 of 4' in got.reason


def test_an_exact_test_that_skips_has_not_passed(tmp_path):
  """pytest exits 0 when every test skips; the record must not say passed."""
  from experiments import reproduce

  skips = tmp_path / 'test_skips.py'
  skips.write_text(
    'import pytest\n\n\ndef test_a():\n  pytest.skip("no torch")\n\n\n'
    'def test_b():\n  pass\n'
  )
  passes = tmp_path / 'test_passes.py'
  passes.write_text('def test_a():\n  pass\n')

  def run(path):
    claim = types.SimpleNamespace(rule=v.ExactTest(str(path)))
    return reproduce.run_exact_test(claim, log=lambda _: None)

  got = run(skips)
  assert got['passed'] is False
  assert (got['tests'], got['skipped'], got['failures']) == (2, 1, 0)
  assert run(passes)['passed'] is True


def test_budget_turns_a_miss_into_inconclusive_but_not_a_success():
  rule = v.Threshold('a', 95.0, '>=')
  miss = _rec({'a': _arm([1.6, 2.0, 1.2])})
  assert v.judge(rule, miss, budget_fraction=0.005).label == v.INCONCLUSIVE
  assert v.judge(rule, miss, budget_fraction=0.05).label == v.MISS
  # The record's own budget wins over the claim's.
  rec = dict(miss, budget_fraction=0.5)
  assert v.judge(rule, rec, budget_fraction=0.005).label == v.MISS
  solved = _rec({'a': _arm([99, 100, 99])})
  assert v.judge(rule, solved, budget_fraction=0.005).label == v.REPRODUCED
  smoke = dict(solved, budget='smoke')
  assert v.judge(rule, smoke).label == v.INCONCLUSIVE


def test_next_step_marks_accelerator_and_rerun_claims():
  old = {'source': 'docs/RESULTS.md at commit x, measured earlier, not rerun'}
  new = {'source': 'python -m experiments.reproduce'}
  assert v.next_step(v.INCONCLUSIVE, old, False) == 'accelerator run'
  assert v.next_step(v.NOT_RUN, None, True) == 'accelerator run'
  assert v.next_step(v.PARTIAL, old, False) == 'rerun'
  assert v.next_step(v.MISS, new, False) == ''
  settled = dict(old, seeds=[0, 1, 2], seed_kind='training')
  assert v.next_step(v.MISS, settled, False) == ''
  assert v.next_step(v.MISS, dict(settled, seed_kind='sampling'), False) == (
    'rerun'
  )
  assert v.next_step(v.REPRODUCED, old, False) == ''
  # A benchmark's own record, made before reproduce measured the claim.
  bench = {'source': 'python -m experiments.benchmarks.x', 'seeds': [0, 1, 2]}
  assert v.next_step(v.PARTIAL, bench, False) == 'rerun'
  assert v.next_step(v.MISS, bench, False) == ''
  # Unmatched samples settle nothing: a transcribed one is rerun.
  assert v.next_step(v.NOT_MATCHED, settled, False) == 'rerun'
  assert v.next_step(v.NOT_MATCHED, new, False) == ''


def test_no_record_or_missing_arm_is_not_run():
  rule = v.Threshold('a', 1.0)
  assert v.judge(rule, None).label == v.NOT_RUN
  assert v.judge(rule, _rec({'b': _arm([0.5])})).label == v.NOT_RUN


# Registry and records ------------------------------------------------------


def test_every_claim_is_complete():
  assert len(registry.CLAIMS) >= 60
  for claim in registry.CLAIMS.values():
    # Ids are command-line names and markdown anchors.
    assert re.fullmatch(r'[a-z0-9]+(-[a-z0-9]+)*', claim.id), claim.id
    assert claim.statement and claim.paper_value and claim.metric, claim.id
    assert claim.protocol in spec.PROTOCOLS
    assert claim.command, claim.id
    assert claim.arxiv == '' or len(claim.arxiv.split('.')) == 2, claim.id
    for arm in claim.arms:
      cfg = arm.config.split(':')[0]
      assert os.path.exists(os.path.join(ROOT, cfg)), (claim.id, cfg)


def test_group_baselines_train_as_long_as_the_groups_preset():
  from experiments.claims import pdssm
  from experiments.configs import state_tracking as st_cfgs

  for task, steps in pdssm.GROUP_STEPS.items():
    preset = st_cfgs.get_config(f'pdssm,{task},groups')
    assert preset.train.num_steps == steps, task
    for model in ('complex-diag', 'transformer'):
      arm = registry.get(f'{model}-fails-{task}').arms[0]
      overrides = dict(arm.overrides)
      assert overrides['train.num_steps'] == steps
      assert overrides['task.loss_on'] == preset.task.loss_on
      assert overrides['task.curriculum_steps'] == preset.task.curriculum_steps


def test_unknown_claim_names_the_closest():
  with pytest.raises(KeyError, match='quickstart-bound'):
    registry.get('quickstart-bund')


def test_committed_records_are_valid_and_every_verdict_is_computed():
  latest = records.latest()
  assert latest, 'no records committed'
  for claim_id, rec in latest.items():
    assert claim_id in registry.CLAIMS, claim_id
    assert 'verdict' not in rec, f'{claim_id}: a verdict is never typed'
    claim = registry.CLAIMS[claim_id]
    got = v.judge(claim.rule, rec, claim.budget_fraction, claim.budget_floor)
    assert got.label in v.VERDICTS
  # Every claim that is not an accelerator or paper-scale run has a record,
  # or says why not (pending); a recorded claim is no longer pending.
  missing = [
    c.id
    for c in registry.CLAIMS.values()
    if c.id not in latest and not c.accelerator and not c.pending.strip()
  ]
  assert not missing, missing
  stale = [
    c.id for c in registry.CLAIMS.values() if c.pending and c.id in latest
  ]
  assert not stale, stale
  from experiments.claims.figures import FIGURES

  for fig in FIGURES:
    assert fig.path.startswith('docs/images/'), fig.path
    assert os.path.isfile(os.path.join(ROOT, fig.path)), fig.path
    if fig.table:
      assert os.path.isfile(os.path.join(ROOT, fig.table)), fig.table
  for rec in latest.values():  # Figures RESULTS shows exist.
    for figure in rec.get('figures', ()):
      assert os.path.isfile(os.path.join(ROOT, figure)), (rec['claim'], figure)


def _full_record(arms):
  """A record with every field ``records.validate`` requires."""
  return {
    'claim': 'x',
    'source': 's',
    'commit': 'c',
    'date': 'd',
    'host': {},
    'command': 'c',
    'arms': arms,
  }


def test_arm_of_turns_per_seed_fields_into_per_seed_lists():
  got = records.arm_of(
    [0, 2], [{'value': 30.0, 'entropy': 4.40}, {'value': 31.0, 'entropy': 4.41}]
  )
  assert got == {
    'seeds': [0, 2],
    'values': [30.0, 31.0],
    'entropy': [4.4, 4.41],
  }


def test_a_record_without_values_is_refused(tmp_path):
  bad = _full_record({'a': {'seeds': [0]}})
  with pytest.raises(ValueError, match='neither values nor a mean'):
    records.write(bad, 't', str(tmp_path))
  del bad['command']
  with pytest.raises(ValueError, match='command'):
    records.validate(bad)
  good = {**bad, 'command': 'c', 'arms': {'a': {'values': [1.0]}}}
  records.validate({**good, 'figures': ['docs/images/f.png']})
  with pytest.raises(ValueError, match='under docs/images'):
    records.validate({**good, 'figures': ['/tmp/f.png']})


def test_details_come_from_the_validation_that_chose_the_tested_params(
  tmp_path,
):
  from experiments import reproduce, results_doc

  rows = [
    {'step': 3, 'split': 'validation', 'faithful_relations': 0.0},
    {'step': 6, 'split': 'train', 'faithful_relations': 0.5},
    {'step': 6, 'split': 'validation', 'faithful_relations': 0.25},
    # A resumed run evaluates step 6 again: the later record counts.
    {'step': 6, 'split': 'validation', 'faithful_relations': 1.0},
  ]
  (tmp_path / 'metrics.jsonl').write_text(
    ''.join(json.dumps(r) + '\n' for r in rows)
  )
  chosen = reproduce.chosen_validation(str(tmp_path), {'best_step': 6})
  assert chosen['faithful_relations'] == 1.0
  assert reproduce.chosen_validation(str(tmp_path), {'best_step': 9}) == {}
  arm = _arm([99.0, 50.0], details={'faithful_relations': [1.0, None]})
  rec = _full_record({'pdssm': arm})
  records.validate(rec)
  arm['reused_seeds'] = [1]
  text = '\n'.join(results_doc._details_text(rec['arms']))
  assert 'pdssm, seeds 1: finished before this call' in text
  assert 'faithful_relations of the tested parameters: s0: 1.0000, s1: -' in (
    text
  )
  arm['details']['faithful_relations'].pop()
  with pytest.raises(ValueError, match='one value per seed'):
    records.validate(rec)


def _write_curve(workdir, points):
  os.makedirs(workdir, exist_ok=True)
  rows = [
    {'step': step, 'split': split, 'bits_per_token': value}
    for step, value, split in points
  ]
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in rows))


def test_steps_to_reach_interpolates_between_evaluations():
  from experiments.claims import derived as curves

  curve = [(100, 4.0), (200, 3.0), (300, 2.5)]
  # 3.0 -> 2.5 over 100 steps: 2.75 is half way.
  assert curves.steps_to_reach(curve, 2.75) == pytest.approx(250.0)
  assert curves.steps_to_reach(curve, 3.0) == 200.0
  assert curves.steps_to_reach(curve, 5.0) == 100.0  # The first point.
  assert curves.steps_to_reach(curve, 2.0) is None
  # A curve that goes back up is read where it first gets there.
  assert curves.steps_to_reach([(1, 3.0), (2, 1.0), (3, 3.0)], 2.0) == 1.5


def test_extra_steps_is_signed_and_refuses_a_slow_run_that_never_gets_there():
  from experiments.claims import derived as curves

  fast = [(500, 3.0), (1000, 2.6)]
  slow = [(1000, 2.8), (1200, 2.7), (1400, 2.5)]
  # 2.6 is half way from step 1200 to 1400: 1300 steps, 30% more.
  assert curves.extra_steps_percent(fast, slow) == pytest.approx(30.0)
  # A slow run that gets there first: 2.6 is 60% of the way from step
  # 100 to 500, step 340, 66% fewer steps.
  quick = [(100, 2.9), (500, 2.4)]
  assert curves.extra_steps_percent(fast, quick) == pytest.approx(-66.0)
  with pytest.raises(ValueError, match='train it longer'):
    curves.extra_steps_percent(fast, [(1000, 2.9), (2000, 2.7)])
  with pytest.raises(ValueError, match='no validation'):
    curves.extra_steps_percent(fast, [])


def test_a_derived_claim_computes_its_value_from_each_seeds_runs(tmp_path):
  from experiments import reproduce
  from experiments.claims import derived as curves

  claim = registry.get('simple-ce-flops-efficiency')
  assert claim.derived.name == claim.rule.arm
  trained = {'simple_ce': {'workdirs': []}, 'nelbo': {'workdirs': []}}
  # Seed 0: NELBO needs 1500 steps (+50%); seed 1: it gets there at 800.
  for seed, nelbo_at_1000, nelbo_at_2000 in ((0, 2.8, 2.4), (1, 2.5, 2.4)):
    ce = tmp_path / f'ce{seed}'
    nelbo = tmp_path / f'nelbo{seed}'
    _write_curve(ce, [(500, 3.0, 'validation'), (1000, 2.6, 'validation')])
    _write_curve(
      nelbo,
      [
        (600, 2.7, 'validation'),
        (1000, nelbo_at_1000, 'validation'),
        # Only the periodic validation rows make the curve.
        (1000, 0.1, 'final_validation'),
        (2000, nelbo_at_2000, 'validation'),
      ],
    )
    trained['simple_ce']['workdirs'].append(os.path.relpath(ce, ROOT))
    trained['nelbo']['workdirs'].append(os.path.relpath(nelbo, ROOT))
  got = reproduce.derive(claim, trained, (0, 1), log=lambda _: None)
  values = got['extra_steps']['values']
  assert got['extra_steps']['seeds'] == [0, 1]
  assert values == pytest.approx([50.0, -20.0])
  # A resumed run that evaluated step 1000 twice is read at its last row.
  _write_curve(
    tmp_path / 'resumed',
    [(1000, 3.0, 'validation'), (1000, 2.6, 'validation')],
  )
  assert curves.validation_curve(str(tmp_path / 'resumed')) == [(1000, 2.6)]
  _write_curve(tmp_path / 'nelbo0', [(2000, 2.9, 'validation')])
  with pytest.raises(RuntimeError, match='seed 0: .*train it longer'):
    reproduce.derive(claim, trained, (0, 1), log=lambda _: None)


def test_ar_gaps_are_in_bits_per_character_of_each_tokenizer(
  tmp_path, monkeypatch
):
  from ddlm_jax.tasks import language_model
  from experiments import reproduce

  claim = registry.get('bpe-narrows-ar-gap')
  bits = {'mdlm': 3.30, 'ar': 2.27, 'mdlm_bpe': 8.00, 'ar_bpe': 6.00}
  trained = {}
  for name, value in bits.items():
    workdir = tmp_path / name
    workdir.mkdir()
    summary = {'validation': {'bits_per_token': value}}
    (workdir / 'summary.json').write_text(json.dumps(summary))
    trained[name] = {'workdirs': [os.path.relpath(workdir, ROOT)]}
  # BPE tokens hold 2.5 characters here, a character one.
  monkeypatch.setattr(
    language_model,
    'chars_per_token',
    lambda w: 2.5 if os.path.basename(w).endswith('_bpe') else 1.0,
  )
  got = reproduce.derive(claim, trained, (0,), log=lambda _: None)
  assert got['char']['values'] == pytest.approx([1.03])
  assert got['bpe']['values'] == pytest.approx([0.8])  # 2.0 bits / 2.5
  assert v.judge(claim.rule, _rec(got)).label == v.PARTIAL  # One seed.


def test_a_scheduled_sampling_names_its_light_arm():
  import dataclasses

  claim = registry.get('scheduling-saves-flops')
  assert {s.light for s in claim.samplings} == {'light'}
  bad = dataclasses.replace(claim.samplings[0], light='lite')
  with pytest.raises(ValueError, match="unknown arm 'lite'"):
    dataclasses.replace(claim, samplings=(bad,))


def test_a_derived_value_needs_trained_arms_and_no_samplings():
  import dataclasses

  base = registry.get('simple-ce-flops-efficiency')
  with pytest.raises(ValueError, match='derived value'):
    dataclasses.replace(base, arms=())


def test_results_doc_is_generated_from_the_records():
  from experiments import results_doc

  with open(os.path.join(ROOT, 'docs', 'RESULTS.md')) as f:
    committed = f.read()
  assert committed == results_doc.render(), (
    'docs/RESULTS.md is stale: python -m experiments.results_doc'
  )
  # Each runnable claim's section gives its registered command, flags too.
  for claim in registry.CLAIMS.values():
    if claim.arms or claim.measurement:
      assert f'Reproduce: `{claim.command}`' in committed, claim.id
  assert 'reproduce md4-text8 --budget paper`' in committed


def test_rerun_line_names_the_claims_or_says_there_are_none():
  from experiments import results_doc

  assert results_doc.rerun_text(['a', 'b']) == '`a`, `b`.'
  empty = results_doc.rerun_text([])
  assert empty.startswith('None:') and '`' in empty


# The reproduce command ------------------------------------------------------


def _reproduce(*args, cwd=ROOT):
  return subprocess.run(
    [sys.executable, '-m', 'experiments.reproduce', *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=900,
  )


def test_list_shows_every_claim_with_a_verdict_and_a_cost():
  out = _reproduce('--list')
  assert out.returncode == 0, out.stderr
  lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
  for claim_id in registry.CLAIMS:
    row = [ln for ln in lines if ln.split()[0] == claim_id]
    assert row, claim_id
    assert any(label in row[0] for label in v.VERDICTS), row[0]
    assert re.search(r'~\d+(\.\d)? (min|h|d)\b', row[0]), row[0]


def test_unknown_claim_and_bad_seeds_are_refused():
  out = _reproduce('no-such-claim')
  assert out.returncode == 2 and 'no claim' in out.stderr
  out = _reproduce('quickstart-bound', '--seeds', 'x')
  assert out.returncode == 2 and 'seeds' in out.stderr


def _records_of(tmp_path, monkeypatch, **sources):
  """The committed newest records of these claims in tmp_path, each with
  its ``source`` replaced, and every verdict partial: a transcribed one is
  then marked for a rerun, whatever the records say when this runs."""
  from experiments import reproduce

  monkeypatch.setattr(
    reproduce, 'verdict_of', lambda claim, rec: v.Verdict(v.PARTIAL, 'x')
  )
  latest = records.latest()
  for claim_id, source in sources.items():
    rec = dict(latest[claim_id], source=source)
    records.write(rec, 'T', str(tmp_path))
  return str(tmp_path)


_TRANSCRIBED = 'docs/RESULTS.md at commit x, measured earlier, not rerun'
# A timing claim and a training claim before it in the registry.
_QUEUE = ('bd3-kv-cache-speedup', 'bpe-narrows-ar-gap')


def test_rerun_queue_runs_the_timings_first(tmp_path, monkeypatch):
  from experiments import reproduce

  ids = list(registry.CLAIMS)
  # The training claim comes first in the registry; the timing goes first.
  assert ids.index('bpe-narrows-ar-gap') < ids.index('bd3-kv-cache-speedup')
  records_dir = _records_of(
    tmp_path,
    monkeypatch,
    **dict.fromkeys(_QUEUE, _TRANSCRIBED),
    # Measured by reproduce: nothing to rerun, whatever its verdict.
    **{'uniform-wins-few-steps': v.REPRODUCE},
  )
  assert [c.id for c in reproduce.marked(records_dir)] == list(_QUEUE)
  assert reproduce.is_timing(registry.CLAIMS['bd3-kv-cache-speedup'])
  assert not reproduce.is_timing(registry.CLAIMS['bpe-narrows-ar-gap'])


def test_several_claims_run_in_order_each_with_its_own_command(
  tmp_path, monkeypatch, capsys
):
  from experiments import reproduce

  ran = []

  def fake(claim, seeds, budget, runs_dir, records_dir, command, log=print):
    ran.append((claim.id, seeds, budget, command))
    if claim.id == 'quickstart-time':
      raise RuntimeError('its run failed')
    record = {'arms': {'x': {'values': [1.0]}}}
    return record, v.Verdict(v.PARTIAL, 'fake'), 'rec.json'

  monkeypatch.setattr(reproduce, 'reproduce', fake)
  argv = ['quickstart-time', 'quickstart-bound', '--budget=smoke']
  argv += [f'--records_dir={tmp_path}']
  # One failure does not stop the queue; the exit code reports it.
  assert reproduce.main(argv) == 1
  assert [r[0] for r in ran] == ['quickstart-time', 'quickstart-bound']
  assert ran[1][1] == registry.CLAIMS['quickstart-bound'].seeds
  assert ran[1][2] == 'smoke'
  assert ran[1][3] == (
    'python -m experiments.reproduce quickstart-bound --budget=smoke '
    f'--records_dir={tmp_path}'
  )
  err = capsys.readouterr().err
  assert 'quickstart-time: its run failed' in err
  assert 'failed: quickstart-time' in err


def test_a_queue_checks_every_claim_before_the_first_runs(
  tmp_path, monkeypatch, capsys
):
  from experiments import reproduce

  def never(*a, **k):
    raise AssertionError('nothing may run')

  monkeypatch.setattr(reproduce, 'reproduce', never)
  runs = tmp_path / 'runs'
  base = [f'--runs_dir={runs}', f'--records_dir={tmp_path / "rec"}']
  assert reproduce.main(['quickstart-bound', 'no-such-claim', *base]) == 2
  assert 'no claim' in capsys.readouterr().err
  # A timing claim refuses --seeds even behind a valid claim.
  argv = ['quickstart-bound', 'bd3-kv-cache-speedup', '--seeds=0', *base]
  assert reproduce.main(argv) == 2
  assert 'drop --seeds' in capsys.readouterr().err
  assert reproduce.main(['quickstart-bound', '--rerun', *base]) == 2
  assert 'not both' in capsys.readouterr().err
  assert not runs.exists() and not (tmp_path / 'rec').exists()


def test_rerun_dry_run_lists_the_queue_and_its_cost(
  tmp_path, monkeypatch, capsys
):
  from experiments import reproduce

  records_dir = _records_of(
    tmp_path,
    monkeypatch,
    **dict.fromkeys(_QUEUE, _TRANSCRIBED),
  )
  argv = ['--rerun', '--dry_run', f'--records_dir={records_dir}']
  assert reproduce.main(argv) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [ln.split()[0] for ln in lines[:2]] == list(_QUEUE)
  total = sum(registry.CLAIMS[c].cost_minutes for c in _QUEUE)
  assert lines[2].startswith('2 claims, ' + reproduce.cost_text(total))
  empty = tmp_path / 'none'
  empty.mkdir()
  assert reproduce.main(['--rerun', f'--records_dir={empty}']) == 0
  assert 'no claim is marked' in capsys.readouterr().out


@pytest.mark.slow
def test_reproduce_smoke_writes_a_record_and_reuses_finished_runs(tmp_path):
  args = (
    'quickstart-bound',
    '--budget',
    'smoke',
    '--seeds',
    '0',
    '--runs_dir',
    str(tmp_path / 'runs'),
    '--records_dir',
    str(tmp_path / 'records'),
  )
  out = _reproduce(*args)
  assert out.returncode == 0, out.stdout + out.stderr
  files = sorted((tmp_path / 'records').iterdir())
  assert len(files) == 1
  rec = json.loads(files[0].read_text())
  assert rec['budget'] == 'smoke' and rec['seeds'] == [0]
  assert rec['host']['jax'] and rec['host']['cpu'] and rec['commit']
  assert rec['arms']['quickstart']['values'][0] > 0
  assert 'experiments.reproduce quickstart-bound' in rec['command']
  assert rec['wall_seconds'] > 0
  assert 'inconclusive at this budget' in out.stdout
  # A bound claim trains without end-of-run samples (no scorer needed).
  assert '--config.sample.num_samples=0' in out.stdout
  # A second call finds the finished run and does not train again.
  again = _reproduce(*args)
  assert again.returncode == 0
  assert 'finished, reused' in again.stdout
  assert len(list((tmp_path / 'records').iterdir())) == 2
  first, second = (
    json.loads(f.read_text()) for f in sorted((tmp_path / 'records').iterdir())
  )
  assert 'reused_seeds' not in first['arms']['quickstart']
  assert second['arms']['quickstart']['reused_seeds'] == [0]
