"""DDPD through the run config and `experiments.run`.

The config trains a time-free one-logit planner and samples with `ddpd`
from the MDLM denoiser its `sample.light_workdir` names; `ddpd.py:smoke`
trains through the CLI, and with a smoke MDLM run as the denoiser it
samples, counting both networks' calls.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ddlm_jax.diffusion import base
from ddlm_jax.diffusion.ddpd import PlannerProcess
from experiments.configs import ddpd

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_config_builds_the_planner_and_names_its_denoiser():
  c = ddpd.get_config()
  process = base.process_config(c.process.to_dict()).build(85)
  assert isinstance(process, PlannerProcess)
  assert c.model.time_conditioning is False
  assert c.sample.sampler == 'ddpd'
  assert c.sample.light_workdir == ddpd.DENOISER_WORKDIR
  smoke = ddpd.get_config('smoke')
  assert smoke.sample.num_samples == 0 and smoke.sample.light_workdir == ''


def _run(workdir, *args):
  cmd = [sys.executable, '-m', 'experiments.run', f'--workdir={workdir}']
  out = subprocess.run(
    cmd + list(args), cwd=ROOT, capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.slow
def test_smoke_trains_and_samples_with_a_denoiser_run(tmp_path):
  planner, denoiser = tmp_path / 'planner', tmp_path / 'mdlm'
  out = _run(planner, '--config=experiments/configs/ddpd.py:smoke')
  # The planner's BCE is never printed as a likelihood bound.
  assert 'not a likelihood bound' in out.stdout + out.stderr
  assert 'perplexity' not in out.stdout
  saved = json.loads((planner / 'config.json').read_text())
  assert saved['process']['kind'] == 'ddpd_planner'
  records = [
    json.loads(line)
    for line in (planner / 'metrics.jsonl').read_text().splitlines()
  ]
  assert any('loss' in r for r in records)
  _run(denoiser, '--config=experiments/configs/mdlm_quickstart.py:smoke')
  _run(
    planner,
    '--mode=sample',
    '--config=experiments/configs/ddpd.py:smoke',
    f'--config.sample.light_workdir={denoiser}',
    '--config.sample.num_samples=2',
    '--config.sample.steps=8',
  )
  stats = json.loads((planner / 'sample_stats.json').read_text())
  assert stats['sampler'] == 'ddpd' and stats['steps'] == 8
  assert stats['nfe'] == 2 * (8 + 1)  # Both networks, final pass included.
  assert stats['nfe_per_model'] == {'heavy': 9.0, 'light': 9.0}
  assert len(stats['flops_per_call']) == 2
  assert (planner / 'samples.txt').read_text().strip()
