"""The DiffusionGemma recipe through its config and `experiments.run`.

The config's variants build the process and network they name, bad
settings are refused before anything runs, and `dgemma_quickstart.py:smoke`
trains, evaluates and samples through the CLI.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ddlm_jax.diffusion import base, dgemma
from ddlm_jax.models.backbones import get_backbone
from ddlm_jax.training.builders import check_process
from ddlm_jax.training.config import ConfigError
from experiments.configs import dgemma_quickstart

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
  'arg,p,block', [('', 0.5, 16), ('nosc', 0.0, 16), ('nosc,smoke', 0.0, 8)]
)
def test_variants_build_their_process_and_network(arg, p, block):
  c = dgemma_quickstart.get_config(arg)
  process = base.process_config(c.process.to_dict()).build(65)
  assert isinstance(process, dgemma.DGemmaDiffusion)
  assert process.self_conditioning == p
  assert process.block_size == block
  assert c.data.seq_len % block == 0
  check_process(
    base.process_config(c.process.to_dict()), c.model, c.data.seq_len
  )
  mcfg = get_backbone('diffusion_gemma').config(c.model.to_dict(), process)
  assert mcfg.canvas_length == block and mcfg.vocab_size == 65
  assert mcfg.layer_types[-1] == 'full_attention'
  assert c.sample.sampler == 'entropy_bound_canvas'


def test_bad_settings_are_refused_before_running():
  c = dgemma_quickstart.get_config('smoke')
  settings = base.process_config(c.process.to_dict())
  model = dict(c.model.to_dict(), backbone='transformer')
  with pytest.raises(ConfigError, match="backbone='diffusion_gemma'"):
    check_process(settings, model, c.data.seq_len)
  with pytest.raises(ConfigError, match='does not divide'):
    check_process(settings, c.model, 36)
  model = dict(c.model.to_dict(), time_conditioning=True)
  with pytest.raises(ConfigError, match='time-free'):
    check_process(settings, model, c.data.seq_len)
  block = dict(c.process.to_dict(), self_conditioning=2.0)
  with pytest.raises(ConfigError, match='is a probability'):
    check_process(base.process_config(block), c.model, c.data.seq_len)


def _run(workdir, *args):
  cmd = [sys.executable, '-m', 'experiments.run', f'--workdir={workdir}']
  out = subprocess.run(
    cmd + list(args), cwd=ROOT, capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.slow
def test_smoke_trains_evaluates_and_samples_through_the_cli(tmp_path):
  workdir = tmp_path / 'dgemma'
  _run(workdir, '--config=experiments/configs/dgemma_quickstart.py:smoke')
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['process']['kind'] == 'dgemma'
  assert saved['model']['backbone'] == 'diffusion_gemma'
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['validation']['bits_per_token'] > 0
  stats = json.loads((workdir / 'sample_stats.json').read_text())
  assert stats['sampler'] == 'entropy_bound_canvas'
  # 4 canvases of 8 characters, each 1..16 decoder calls.
  assert 4 <= stats['nfe'] <= 4 * stats['steps']
  assert (workdir / 'samples.txt').read_text().strip()
  _run(workdir, '--mode=eval')
  evaluation = json.loads((workdir / 'eval_validation.json').read_text())
  assert evaluation['bits_per_token'] > 0
