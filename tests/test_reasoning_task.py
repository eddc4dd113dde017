"""Tests for the multi-step arithmetic task of the planner/executor runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlm_jax.data import planning_tasks as pt
from ddlm_jax.data import reasoning as rs

# Splits and streams come from the task registry, like every planning task.
ARITH = pt.get_task('arithmetic')


def test_generated_answers_and_plans_match_independent_evaluator():
  data = ARITH.make_split('test', rs.LEVELS, 60, seed=3, plan_len=12)
  assert rs.check_answers(data['question'], data['answer']).all()
  assert rs.plan_correct(data['question'], data['plan']).all()
  # The evaluator can fail: shifted answers and a corrupted plan are caught.
  wrong = (data['answer'] + 1) % rs.MODULUS
  assert not rs.check_answers(data['question'], wrong).any()
  plan = data['plan'].copy()
  plan[:, 0] = (plan[:, 0] + 1) % rs.MODULUS
  assert not rs.plan_correct(data['question'], plan).any()


def test_evaluator_closed_forms():
  assert rs.evaluate_question('7') == 7
  assert rs.evaluate_question('2-5*5*3') == (-45) % 10 == 5
  assert rs.evaluate_question('9*9+3') == 4  # left to right, not precedence
  assert rs.evaluate_question('1-9') == 2
  with pytest.raises(ValueError, match='operator'):
    rs.evaluate_question('1/2')


def test_levels_set_the_number_of_operations():
  data = ARITH.make_split('train', (1, 3, 5), 20, seed=0, plan_len=10)
  for q, plan, level in zip(data['question'], data['plan'], data['level']):
    text = rs.decode(q)
    assert sum(ch in rs.OPS for ch in text) == level
    assert len(text) == 2 * level + 1
    assert len(rs.parse_plan(plan)) == level
  assert data['question'].shape[1] == rs.QUESTION_LEN


def test_deterministic_by_seed_and_split():
  a = ARITH.make_split('test', (2, 4), 30, seed=1, plan_len=8)
  b = ARITH.make_split('test', (2, 4), 30, seed=1, plan_len=8)
  c = ARITH.make_split('validation', (2, 4), 30, seed=1, plan_len=8)
  d = ARITH.make_split('test', (2, 4), 30, seed=2, plan_len=8)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a['question'], c['question'])
  assert not np.array_equal(a['question'], d['question'])
  s1 = next(ARITH.stream_batches(16, (1, 2), seed=0, plan_len=4, start=5))
  s2 = ARITH.stream_batches(16, (1, 2), seed=0, plan_len=4)
  for _ in range(5):
    next(s2)
  s2 = next(s2)
  for k in s1:
    np.testing.assert_array_equal(s1[k], s2[k])
  assert set(np.unique(s1['level'])) <= {1, 2}


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=6), st.data())
def test_encode_decode_roundtrip_and_evaluator(digits, data):
  ops = [data.draw(st.sampled_from(rs.OPS)) for _ in digits[1:]]
  text = str(digits[0]) + ''.join(o + str(d) for o, d in zip(ops, digits[1:]))
  ids = rs.encode(text, rs.QUESTION_LEN + 2)
  assert rs.decode(ids) == text
  value = digits[0]
  for o, d in zip(ops, digits[1:]):  # step-wise mod: a third evaluation
    value = {'+': value + d, '-': value - d, '*': value * d}[o] % 10
  assert rs.evaluate_question(text) == value


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match='plan_len'):
    ARITH.make_split('test', (5,), 2, seed=0, plan_len=8)
  with pytest.raises(ValueError, match='levels'):
    ARITH.make_split('test', (6,), 2, seed=0, plan_len=16)
  with pytest.raises(ValueError, match='split'):
    ARITH.make_split('dev', (1,), 2, seed=0, plan_len=16)
  with pytest.raises(ValueError, match='vocabulary'):
    rs.encode('1/2')
