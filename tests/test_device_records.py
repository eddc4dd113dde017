"""The accelerator claims' records come from the device check's JSON."""

from __future__ import annotations

import json
import pathlib

import pytest

from experiments.claims import device_records

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECK = (
  ROOT
  / 'experiments'
  / 'benchmarks'
  / 'records'
  / 'device_check_h200_2026-12-04.json'
)


def test_records_are_computed_from_the_committed_check():
  check = json.loads(CHECK.read_text())
  records = device_records.records_from_device_check(
    check,
    commit='0816013',
    date='2026-12-04',
    command='python -m experiments.benchmarks.device_check --out=DIR '
    '--budget_s=230',
  )
  for claim, record in records.items():
    saved = (
      ROOT / 'experiments' / 'claims' / 'records' / f'{claim}.20261204.json'
    )
    assert json.loads(saved.read_text()) == record
  mfu = records['gpu-train-step-mfu']['arms']['step']['values']
  assert mfu == [pytest.approx(100 * check['train_step']['mfu'])]
  kernel = records['gpu-block-sparse-attention']['arms']['kernel']['values']
  assert len(kernel) == 4 and min(kernel) > 1.0


def test_a_check_without_timings_is_refused():
  check = json.loads(CHECK.read_text())
  check['attention'] = [r for r in check['attention'] if r['impl'] != 'pallas']
  with pytest.raises(ValueError):
    device_records.records_from_device_check(
      check, commit='x', date='2026-12-04', command='c'
    )
