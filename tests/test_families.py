"""The new process families run end to end through the one trainer.

Uniform-state (UDLM, Duo's curriculum), interpolating and block diffusion
(BD3) configs train, evaluate and sample through `loop` exactly as the
masked quickstart does; each family's math, samplers and kernels are tested
in its own file (test_uniform_diffusion, test_duo, test_uniform_samplers,
test_block_diffusion, test_block_sampling).
"""

import json
import os

import numpy as np
import pytest

from ddlm_jax.tasks import language_model as lm
from ddlm_jax.tasks.language_model import load_run
from ddlm_jax.training import builders
from experiments.configs import bd3_quickstart, duo_quickstart, mdlm_ce
from experiments.configs.common import override


def _config(module, arg, **overrides):
  c = module.get_config(arg)
  c.mesh.shape = (1, 1, 1)
  return override(c, overrides)


def _train_records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(x) for x in f]
  return [r for r in rows if r['split'] == 'train']


@pytest.mark.slow
def test_duo_curriculum_trains_then_switches_evaluates_and_samples(tmp_path):
  """The curriculum runs for curriculum_steps (the loop hands the process
  the global step), then plain UDLM training; eval and sample modes work
  on the checkpoint with the uniform sampler."""
  workdir = str(tmp_path / 'duo')
  c = _config(duo_quickstart, 'curriculum,smoke', **{'train.log_every': 1})
  summary = lm.train_and_evaluate(c, workdir)
  assert summary['process'] == 'duo' and summary['finished']
  phases = {r['step']: r['duo_curriculum'] for r in _train_records(workdir)}
  steps = c.train.num_steps
  assert c.process.curriculum_steps == steps // 2 == 3
  # The step logged as n ran with state.step = n - 1.
  assert phases == {n: float(n - 1 < 3) for n in range(1, steps + 1)}
  assert np.isfinite(summary['validation']['nats_per_token'])
  assert summary['samples']['sampler'] == 'uniform_ancestral'
  assert summary['samples']['nfe'] == c.sample.steps
  again = lm.evaluate_checkpoint(c, workdir)
  assert again['step'] == steps
  np.testing.assert_allclose(
    again['nats_per_token'],
    summary['validation']['nats_per_token'],
    rtol=1e-5,
  )
  # The saved samples are text of the data vocabulary (no mask id exists).
  run = load_run(workdir)
  assert run.process.family == 'uniform'
  assert run.process.input_vocab_size == run.data.tokenizer.vocab_size


@pytest.mark.slow
@pytest.mark.parametrize(
  'module,arg,kind',
  [
    (duo_quickstart, 'smoke', 'udlm'),
    (duo_quickstart, 'interpolating,smoke', 'interpolating'),
  ],
)
def test_family_configs_train_and_sample(tmp_path, module, arg, kind):
  c = _config(module, arg)
  summary = lm.train_and_evaluate(c, str(tmp_path / 'run'))
  assert summary['process'] == kind and summary['finished']
  assert np.isfinite(summary['validation']['nats_per_token'])
  assert summary['samples']['num_samples'] == c.sample.num_samples


@pytest.mark.slow
def test_bd3_fine_tunes_from_an_mdlm_run_and_samples_with_the_kv_cache(
  tmp_path, smoke_mdlm_run
):
  """BD3 starts from a masked run's parameters (the paper's recipe), its
  reported bound is the unclipped one, and --mode=sample draws block by
  block with the cache."""
  mdlm_dir, _ = smoke_mdlm_run
  workdir = str(tmp_path / 'bd3')
  c = _config(
    bd3_quickstart,
    '8,smoke',
    **{'train.init_from': mdlm_dir, 'process.clip_low': 0.3},
  )
  summary = lm.train_and_evaluate(c, workdir)
  assert summary['process'] == 'bd3' and summary['finished']
  run = load_run(workdir)
  assert run.process.clip == (0.3, 1.0)
  assert run.process.evaluation_process.clip == (0.0, 1.0)
  stats = lm.sample_checkpoint(c, workdir)
  assert stats['sampler'] == 'block'
  assert stats['sampler_params']['use_kv_cache']
  # Blocks of 8 over 32 positions: 4 blocks, each at least one call.
  assert stats['nfe'] >= 4


def test_simple_ce_config_builds_the_simple_ce_process():
  """mdlm_ce is the quickstart recipe with loss_type='simple_ce' (its loss
  is tested in test_diffusion; training it end to end adds nothing the
  quickstart smoke run does not already check)."""
  c = _config(mdlm_ce, 'smoke')
  process = builders.check_process(
    builders.process_settings(c.process),
    c.model,
    c.data.seq_len,
    c.get('soft_mask'),
  )
  assert process.loss_type == 'simple_ce' and process.family == 'masked'


def test_process_families_are_declared_for_every_kind():
  """Every registered kind builds a process of the family its config
  declares, implementing the contract of that family."""
  from ddlm_jax.diffusion import base

  want = {
    'mdlm': 'masked',
    'md4': 'masked',
    'ar': 'autoregressive',
    'udlm': 'uniform',
    'duo': 'uniform',
    'interpolating': 'interpolating',
    'bd3': 'block',
  }
  assert set(want) <= set(base.registered_kinds())
  for kind, family in want.items():
    settings = base.process_config({'kind': kind})
    process = settings.build(8)
    assert settings.family == process.family == family
    assert isinstance(process, base.Process)
    diffusion = family != 'autoregressive'
    assert isinstance(process, base.DiffusionProcess) == diffusion
    assert isinstance(process, base.BlockProcess) == (family == 'block')


def test_clip_search_bands_are_checked():
  from experiments.clip_search import parse_clips

  assert parse_clips('0,1; 0.3,0.8') == [(0.0, 1.0), (0.3, 0.8)]
  for bad in ('0.8,0.3', '0,1,2', '', '-0.1,0.5'):
    with pytest.raises(ValueError, match='BETA|no band'):
      parse_clips(bad)
