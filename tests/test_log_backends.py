"""log.backends: TensorBoard and W&B writers next to metrics.jsonl."""

import glob
import json
import os
import struct
import sys

import pytest

from ddlm_jax.training import log_backends
from ddlm_jax.training.config import ConfigError
from ddlm_jax.training.metrics import MetricsWriter, read_metrics


def test_backends_parse_and_unknown_names_are_refused():
  assert log_backends.parse_backends('') == ('jsonl',)
  assert log_backends.parse_backends('tensorboard, jsonl,tensorboard') == (
    'jsonl',
    'tensorboard',
  )
  with pytest.raises(ConfigError, match="unknown backend 'tensorbord'"):
    log_backends.parse_backends('jsonl,tensorbord')
  with pytest.raises(ConfigError, match='wandb_mode'):
    log_backends.check_backends({'backends': 'jsonl', 'wandb_mode': 'on'})


def test_a_missing_package_names_its_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # import wandb fails.
  with pytest.raises(ConfigError, match=r'pip install -e "\.\[wandb\]"'):
    log_backends.check_backends({'backends': 'jsonl,wandb'})


def test_wandb_is_offline_without_a_key(monkeypatch, tmp_path):
  monkeypatch.delenv('WANDB_MODE', raising=False)
  monkeypatch.delenv('WANDB_API_KEY', raising=False)
  monkeypatch.setenv('HOME', str(tmp_path))  # No ~/.netrc login either.
  assert log_backends.wandb_mode('auto') == 'offline'
  assert log_backends.wandb_mode('disabled') == 'disabled'
  monkeypatch.setenv('WANDB_MODE', 'disabled')
  assert log_backends.wandb_mode('online') == 'disabled'


def test_without_backends_only_metrics_jsonl_is_written(tmp_path):
  writer = MetricsWriter(str(tmp_path), config={'log': {'backends': 'jsonl'}})
  writer.write(1, 'train', {'loss': 2.0})
  writer.close()
  assert sorted(os.listdir(tmp_path)) == ['metrics.jsonl']


def _tb_scalars(logdir: str) -> dict[tuple[str, int], float]:
  """{(tag, step): value} from TensorBoard event files (TFRecord framing)."""
  from tensorboardX.proto import event_pb2

  out = {}
  for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
    data = open(path, 'rb').read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack('<Q', data[pos : pos + 8])
      record = data[pos + 12 : pos + 12 + length]
      pos += 12 + length + 4
      event = event_pb2.Event.FromString(record)
      for value in event.summary.value:
        out[(value.tag, event.step)] = value.simple_value
  return out


def test_tensorboard_gets_every_number_of_the_record(tmp_path):
  pytest.importorskip('tensorboardX', reason='the tensorboard extra')
  config = {'log': {'backends': 'jsonl,tensorboard'}}
  writer = MetricsWriter(str(tmp_path), config=config)
  writer.write(2, 'train', {'loss': 1.5, 'steps_per_sec': 3.0, 'note': 'x'})
  writer.write(4, 'validation', {'bits_per_token': 2.25})
  writer.close()
  got = _tb_scalars(str(tmp_path / 'tensorboard'))
  assert got == {
    ('train/loss', 2): 1.5,
    ('train/steps_per_sec', 2): 3.0,
    ('validation/bits_per_token', 4): 2.25,
  }
  assert [r['step'] for r in read_metrics(str(tmp_path))] == [2, 4]


def test_wandb_logs_offline_into_the_workdir(tmp_path, monkeypatch):
  pytest.importorskip('wandb', reason='the wandb extra')
  monkeypatch.delenv('WANDB_MODE', raising=False)
  monkeypatch.delenv('WANDB_API_KEY', raising=False)
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  monkeypatch.setenv('WANDB_SILENT', 'true')
  config = {'log': {'backends': 'wandb', 'wandb_mode': 'auto'}, 'seed': 3}
  writer = MetricsWriter(str(tmp_path), config=config)
  (wb,) = writer._backends
  assert wb.mode == 'offline'
  writer.write(2, 'train', {'loss': 1.5})
  writer.write(4, 'validation', {'bits_per_token': 2.25})
  writer.write(4, 'train', {'loss': 1.25})  # Same step: both kept.
  writer.write(6, 'train', {'loss': 1.0})  # Commits step 4.
  summary = dict(wb._run.summary)
  assert wb._run.config['seed'] == 3
  writer.close()
  assert summary['train/loss'] == 1.25
  assert summary['validation/bits_per_token'] == 2.25
  runs = glob.glob(str(tmp_path / 'wandb' / 'offline-run-*' / '*.wandb'))
  assert len(runs) == 1
  run_id = (tmp_path / 'wandb_id').read_text()
  assert runs[0].endswith(f'run-{run_id}.wandb')
  assert json.loads((tmp_path / 'metrics.jsonl').read_text().splitlines()[0])


def test_a_training_run_logs_to_tensorboard(tmp_path):
  pytest.importorskip('tensorboardX', reason='the tensorboard extra')
  from ddlm_jax.tasks import language_model as lm
  from experiments.configs import quickstart

  c = quickstart.get_config('smoke')
  c.sample.num_samples = 0
  c.mesh.shape = (1, 1, 1)
  c.log.backends = 'jsonl,tensorboard'
  lm.train_and_evaluate(c, str(tmp_path))
  got = _tb_scalars(str(tmp_path / 'tensorboard'))
  records = read_metrics(str(tmp_path))
  for r in records:
    for key, value in r.items():
      if key not in ('step', 'split') and isinstance(value, float):
        assert got[(f'{r["split"]}/{key}', r['step'])] == pytest.approx(
          value, rel=1e-6
        )
  assert ('final_validation/bits_per_token', 6) in got
