"""The group claims' learning-curve figure (experiments.group_curves)."""

import json

import pytest

from experiments import group_curves
from experiments.claims import records


def _write_run(workdir):
  workdir.mkdir(parents=True)
  rows = [
    {'step': 100, 'split': 'train', 'acc': 0.2, 'acc_best': 0.3},
    {
      'step': 250,
      'split': 'validation',
      'accuracy': 0.1,
      'bijective_frac': 0.5,
      'faithful_relations': 0.0,
    },
    {'step': 300, 'split': 'train', 'acc': 0.6, 'acc_best': 0.9},
    {
      'step': 500,
      'split': 'validation',
      'accuracy': 0.4,
      'bijective_frac': 0.75,
      'faithful_relations': 0.0,
    },
    # Resumed at 250: the step-500 evaluation is written again.
    {
      'step': 500,
      'split': 'validation',
      'accuracy': 1.0,
      'bijective_frac': 1.0,
      'faithful_relations': 1.0,
    },
  ]
  (workdir / 'metrics.jsonl').write_text(
    ''.join(json.dumps(r) + '\n' for r in rows)
  )


def test_curves_read_every_evaluation_once_and_the_best_restart(tmp_path):
  _write_run(tmp_path / 'run')
  curves = group_curves.run_curves(str(tmp_path / 'run'))
  assert curves['accuracy'] == ([250, 500], [10.0, 100.0])
  assert curves['bijective_frac'] == ([250, 500], [0.5, 1.0])
  assert curves['faithful_relations'] == ([250, 500], [0.0, 1.0])
  assert curves['train'] == ([100, 300], [30.0, 90.0])


def test_claim_runs_come_from_the_newest_record_and_are_drawn(tmp_path):
  _write_run(tmp_path / 'runs' / 's0')
  with pytest.raises(ValueError, match='no record yet'):
    group_curves.claim_runs('pdssm-a5', str(tmp_path / 'records'))
  record = {
    'claim': 'pdssm-a5',
    'source': 'test',
    'commit': 'c',
    'date': 'd',
    'host': {},
    'command': 'c',
    'arms': {
      'pdssm': {
        'seeds': [0],
        'values': [100.0],
        'workdirs': [str(tmp_path / 'runs' / 's0')],
      }
    },
  }
  records.write(record, 't', str(tmp_path / 'records'))
  runs = group_curves.claim_runs('pdssm-a5', str(tmp_path / 'records'))
  assert runs == [(0, str(tmp_path / 'runs' / 's0'))]
  group_curves.main(
    [
      '--claims=pdssm-a5',
      f'--records_dir={tmp_path / "records"}',
      f'--out={tmp_path / "fig.png"}',
    ]
  )
  assert (tmp_path / 'fig.png').stat().st_size > 1000


def test_imports_beside_the_other_experiment_drivers():
  # Its options are its own: absl flags are global to the process, and the
  # state-tracking sweep defines --out as well (tests import both).
  import importlib

  from experiments import sweep_state_tracking

  importlib.reload(group_curves)
  assert sweep_state_tracking.run_dir('o', 'm', 't', 0)
  assert group_curves.parse(['--out=x.png']).out == 'x.png'
