"""One set of config key names: the renames, the migration, the refusals.

The training batch is `train.batch_size` for every task (it was
`data.batch_size` in the LM configs) and a planner/executor stage's length
is `{stage}.num_steps` (was `{stage}.steps`). Saved runs with the old keys
still load; old spellings in a config, an override or a command line fail
in one line that names the new key.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
from absl import flags
from ml_collections import config_flags

from ddlm_jax.tasks import language_model as run_lib
from ddlm_jax.tasks import planner as planner_task
from ddlm_jax.training import builders
from ddlm_jax.training import config as config_lib
from ddlm_jax.training.config import ConfigError
from experiments import flag_errors as cli
from experiments.configs import planner_executor, quickstart


def _old_lm_dict(batch: int = 24) -> dict:
  """A quickstart smoke config as a run saved before the rename had it."""
  d = quickstart.get_config('smoke').to_dict()
  del d['train']['batch_size']
  d['data']['batch_size'] = batch
  return d


def test_every_old_key_is_gone_and_its_new_key_exists():
  """The table names real keys: no shipped config has an old one."""
  lm = quickstart.get_config('smoke')
  pe = planner_executor.get_config(planner_executor.SMOKE_ARG)
  for old, new in config_lib.RENAMED_KEYS.items():
    config = lm if new.startswith('train.') else pe
    block, leaf = new.split('.')
    assert leaf in config[block], new
    assert old.split('.')[1] not in config[old.split('.')[0]], old
  config_lib.check_renamed_keys(lm)  # Nothing to refuse.
  planner_task.check_config(pe)


def test_migration_moves_a_saved_batch_size_and_nothing_else():
  saved = _old_lm_dict(24)
  want = copy.deepcopy(saved)
  del want['data']['batch_size']
  want['train']['batch_size'] = 24
  assert config_lib.migrate_config(saved) == want
  assert config_lib.migrate_config(copy.deepcopy(want)) == want  # Idempotent.


def test_migration_creates_a_missing_block_and_moves_stage_steps():
  saved = {
    'data': {'batch_size': 8, 'seq_len': 4},
    'planner': {'steps': 3, 'batch_size': 2},
    'latent': {'steps': 5},
  }
  assert config_lib.migrate_config(saved) == {
    'data': {'seq_len': 4},
    'train': {'batch_size': 8},
    'planner': {'num_steps': 3, 'batch_size': 2},
    'latent': {'num_steps': 5},
  }


def test_migration_of_both_keys_keeps_an_agreeing_value_refuses_a_clash():
  both = {'data': {'batch_size': 8}, 'train': {'batch_size': 8}}
  assert config_lib.migrate_config(both) == {
    'data': {},
    'train': {'batch_size': 8},
  }
  clash = {'data': {'batch_size': 8}, 'train': {'batch_size': 16}}
  with pytest.raises(ConfigError, match='data.batch_size=8 and train.batch'):
    config_lib.migrate_config(clash)


def test_load_config_reads_an_old_run_and_refuses_old_overrides(tmp_path):
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(_old_lm_dict(24), f)
  config = run_lib.load_config(str(tmp_path))
  assert config.train.batch_size == 24 and 'batch_size' not in config.data
  again = run_lib.load_config(str(tmp_path), {'train.batch_size': 4})
  assert again.train.batch_size == 4
  with pytest.raises(ConfigError, match='renamed train.batch_size'):
    run_lib.load_config(str(tmp_path), {'data.batch_size': 4})


def test_a_config_with_an_old_key_is_refused_before_anything_is_written(
  tmp_path,
):
  c = quickstart.get_config('smoke')
  c.data.batch_size = 8  # A config file written before the rename.
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError) as err:
    run_lib.Run(c, str(workdir))
  assert str(err.value) == (
    'config key data.batch_size was renamed train.batch_size (the same '
    'setting); use --config.train.batch_size=... or set train.batch_size '
    'in the config.'
  )
  assert not workdir.exists()


def test_planner_stage_blocks_read_num_steps_and_refuse_steps():
  c = planner_executor.get_config('latent,smoke')
  c.train.max_stage_steps = 0
  c.executor.num_steps = 7
  assert planner_task.num_steps(c, c.executor) == 7
  assert planner_task.stage_trainer_config(c, 'executor').num_steps == 7
  c.train.max_stage_steps = 3
  assert planner_task.num_steps(c, c.executor) == 3
  c.executor.num_steps = 0
  with pytest.raises(ConfigError, match=r'executor.num_steps=0'):
    planner_task.check_config(c)
  c.executor.num_steps = 3
  c.latent.steps = 3
  with pytest.raises(ConfigError) as err:
    planner_task.check_config(c)
  assert str(err.value) == config_lib.renamed_key_message('latent.steps')


def test_train_batches_take_the_global_batch_from_train_block():
  c = quickstart.get_config('smoke')
  c.train.batch_size = 3
  data = builders.prepare_data(builders.data_settings(c.data), None)
  batch = next(builders.train_batches(c, data, c.seed))
  assert batch['tokens'].shape == (3, c.data.seq_len)


# ----------------------------------------------------------- command line


def _parse(argv, capsys):
  """experiments.run's flag parsing on its own FlagValues: (code, stderr)."""
  fv = _flag_values(['run', *argv])
  with pytest.raises(SystemExit) as stop:
    cli.parse_flags(['run', *argv], flag_values=fv)
  return stop.value.code, capsys.readouterr().err


def _flag_values(argv):
  """A private FlagValues with run.py's --config (its overrides come from
  argv, as they do from sys.argv) and --workdir."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
    'config', None, '', flag_values=fv, sys_argv=argv
  )
  flags.DEFINE_string('workdir', None, '', flag_values=fv)
  return fv


@pytest.mark.parametrize(
  'config, flag, line',
  [
    (
      'quickstart.py:smoke',
      ['--config.data.batch_size=64'],
      '--config.data.batch_size was renamed --config.train.batch_size (the '
      'same setting); pass --config.train.batch_size=64.',
    ),
    (
      'quickstart.py:smoke',
      ['--config.data.batch_size', '16'],
      '--config.data.batch_size was renamed --config.train.batch_size (the '
      'same setting); pass --config.train.batch_size=16.',
    ),
    (
      'planner_executor.py:latent,smoke',
      ['--config.planner.steps=5'],
      '--config.planner.steps was renamed --config.planner.num_steps (the '
      'same setting); pass --config.planner.num_steps=5.',
    ),
    (
      'planner_executor.py:latent,smoke',
      ['--config.latent.steps=2'],
      '--config.latent.steps was renamed --config.latent.num_steps (the '
      'same setting); pass --config.latent.num_steps=2.',
    ),
  ],
  ids=['lm', 'lm_spaced_value', 'planner', 'projector'],
)
def test_cli_names_the_new_key_of_a_renamed_flag_in_one_line(
  config, flag, line, capsys
):
  code, err = _parse(
    [f'--config=experiments/configs/{config}', '--workdir=/nonexistent', *flag],
    capsys,
  )
  assert code == 2
  assert err.strip().splitlines() == [f'error: bad flag: {line}']


def test_cli_still_parses_new_keys_and_reports_typos(capsys):
  argv = [
    'run',
    '--config=experiments/configs/quickstart.py:smoke',
    '--config.train.batch_size=16',
  ]
  fv = _flag_values(argv)
  cli.parse_flags(argv, flag_values=fv)
  assert fv.config.train.batch_size == 16
  code, err = _parse(
    [
      '--config=experiments/configs/quickstart.py:smoke',
      '--config.model.wid=3',
    ],
    capsys,
  )
  assert code == 2 and 'renamed' not in err
  assert err.startswith("error: bad flag: 'wid' Did you mean")


def test_renamed_flag_ignores_keys_that_kept_their_name():
  argv = ['run', '--config.sample.steps=8', '--config.plan.steps=4']
  assert cli.renamed_flag(argv) is None
  argv += ['--config.eval.batch_size=8', '--config.sample.batch_size=2']
  assert cli.renamed_flag(argv) is None


# ------------------------------------------------------------- saved runs


@pytest.mark.slow
def test_a_run_saved_with_the_old_key_loads_and_scores_the_same(
  smoke_mdlm_run, tmp_path
):
  """The key moved, the value did not: same batch, same restored numbers."""
  workdir, _ = smoke_mdlm_run
  old = str(tmp_path / 'old')
  shutil.copytree(workdir, old)
  path = os.path.join(old, 'config.json')
  with open(path) as f:
    saved = json.load(f)
  saved['data']['batch_size'] = saved['train'].pop('batch_size')
  with open(path, 'w') as f:
    json.dump(saved, f)
  runs = [run_lib.load_run(d) for d in (workdir, old)]
  try:
    assert runs[0].config.to_dict() == runs[1].config.to_dict()
    assert runs[1].trainer_config == runs[0].trainer_config
    scores = [
      r.evaluate('validation', num_batches=1, time_samples=1) for r in runs
    ]
    assert scores[0] == scores[1]
  finally:
    for r in runs:
      r.close()
