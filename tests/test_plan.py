"""The planner's numbers against programs that really run on CPU.

Tolerances: the planned FLOPs of a step equal the XLA count of the
train-step benchmark's compiled step within 1% (same program, built two
ways), the closed form within 20% (it leaves out norms, softmax, the loss
and the optimizer); the planned train state per device equals the bytes
of a really initialised, sharded state exactly; the planned peak is
within 10% of the benchmark's compiled step.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.parallel import make_mesh
from ddlm_jax.tasks import plans
from ddlm_jax.training import builders
from ddlm_jax.training import plan as plan_lib
from ddlm_jax.training.config import ConfigError
from ddlm_jax.training.optimizer import make_optimizer
from ddlm_jax.training.state import init_train_state
from experiments.benchmarks import train_step as bench_lib

VOCAB, WIDTH, LENGTH, BATCH = 64, 32, 32, 8


def _cfg(remat=False):
  return TransformerConfig(
    vocab_size=VOCAB,
    input_vocab_size=VOCAB + 1,
    width=WIDTH,
    depth=2,
    num_heads=2,
    remat=remat,
  )


def _process():
  return MaskedDiffusion(get_schedule('loglinear'), VOCAB, t_min=1e-3)


def _spec(mesh, **kw):
  # The benchmark's optimizer (build_train_step's defaults).
  tx, _ = make_optimizer(learning_rate=1e-3, warmup_steps=10, total_steps=1000)
  return plan_lib.LMSpec(
    build=lambda remat: lambda rngs: Transformer(_cfg(remat), rngs=rngs),
    process=_process(),
    tx=tx,
    mesh=mesh,
    batch_size=BATCH,
    seq_len=LENGTH,
    num_steps=1000,
    model_config=_cfg(),
    **kw,
  )


@pytest.fixture(scope='module')
def single():
  """The plan on one device and the benchmark's step of the same model."""
  mesh = make_mesh((1, 1, 1))
  plan = plan_lib.plan_lm(_spec(mesh), sections=('train', 'remat'))
  bench = bench_lib.build_train_step(
    _cfg(), _process(), batch=BATCH, length=LENGTH
  )
  bench.step()  # The compiled program really runs.
  return plan, bench


def test_flops_agree_with_the_benchmark_count(single):
  plan, bench = single
  measured = bench_lib.flops(bench.compiled)
  assert plan['flops']['train_step'] == pytest.approx(measured, rel=0.01)
  closed = plan['flops']['closed_form_train_step']
  assert closed == pytest.approx(measured, rel=0.2)
  assert plan['flops']['per_token'] == pytest.approx(
    measured / (BATCH * LENGTH), rel=0.01
  )


def test_memory_agrees_with_the_compiled_step(single):
  plan, bench = single
  mem = plan['memory_per_device']
  state = bench.state
  real = sum(
    np.asarray(x).nbytes
    for x in jax.tree.leaves((state.params, state.opt_state))
    if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
  )
  assert mem['state_params'] + mem['state_optimizer'] == real
  assert mem['state_params'] == 4 * plan['params']
  assert plan['params'] == bench.params
  compiled = plan_lib.memory_of(bench.compiled)['peak']
  assert mem['peak'] == pytest.approx(compiled, rel=0.1)
  # A step holds at least its state, and the checkpoint is params + Adam.
  assert mem['peak'] >= real
  assert plan['checkpoint_bytes'] == pytest.approx(
    3 * mem['state_params'], rel=1e-3
  )
  assert mem['peak_with_remat'] > 0


def test_sharded_plan_splits_flops_and_state_per_device():
  """On 8 fake devices: data parallel splits the FLOPs 8 ways; fsdp
  splits the planned state exactly as a really initialised state."""
  if len(jax.devices()) < 8:
    pytest.skip('needs 8 (fake) devices; tests/conftest.py sets them')
  one = plan_lib.plan_lm(_spec(make_mesh((1, 1, 1))), sections=())
  mesh = make_mesh((1, 8, 1))
  spec = _spec(mesh)
  fsdp = plan_lib.plan_lm(spec, sections=())
  assert fsdp['devices'] == 8
  assert fsdp['flops']['train_step_per_device'] == pytest.approx(
    one['flops']['train_step'] / 8, rel=0.15
  )
  _, state, _ = init_train_state(
    spec.build(False), spec.tx, seed=0, mesh=mesh, use_ema=False
  )
  per_device = sum(
    x.addressable_shards[0].data.nbytes
    for x in jax.tree.leaves((state.params, state.opt_state))
  )
  mem = fsdp['memory_per_device']
  assert mem['state_params'] + mem['state_optimizer'] == per_device
  assert mem['state_params'] < one['memory_per_device']['state_params']


def test_switches_name_what_makes_a_plan_fit():
  gib = 2**30
  fix = {'remat': False, 'grad_accum_steps': 1, 'data': 8, 'fsdp': 1}
  assert plan_lib.switches(10 * gib, 5 * gib, 2 * gib, 6 * gib, fix) == [
    '--config.model.remat=True'
  ]
  got = plan_lib.switches(10 * gib, 8 * gib, 2 * gib, 5 * gib, fix)
  assert got == [
    '--config.model.remat=True',
    '--config.optim.grad_accum_steps=2',
  ]
  # The state alone exceeds the chip: only fsdp (or more chips) helps.
  got = plan_lib.switches(20 * gib, None, 16 * gib, 6 * gib, fix)
  assert got[0].startswith('--config.mesh.shape="(2,4,1)"')
  # 2 rows per device: 4 micro-batches would not split over the devices.
  small = {**fix, 'batch': 16}
  got = plan_lib.switches(10 * gib, 8 * gib, 2 * gib, 4.5 * gib, small)
  assert '--config.optim.grad_accum_steps=4' not in got
  assert plan_lib.switches(10 * gib, 8 * gib, 2 * gib, 4.5 * gib, fix)[-1] == (
    '--config.optim.grad_accum_steps=4'
  )
  got = plan_lib.switches(90 * gib, None, 80 * gib, 6 * gib, fix)
  assert got == ['more chips (the train state alone does not fit)']


def test_time_estimates_scale_with_chips_and_steps():
  est = plan_lib.time_estimates(1e15, 4, 1000, mfu=0.5)
  assert est['v5p']['step_seconds'] == pytest.approx(1e15 / (4 * 459e12 * 0.5))
  assert est['H100']['run_days'] == pytest.approx(
    1000 * 1e15 / (4 * 989e12 * 0.5) / 86400
  )


def test_largest_tensor_reads_hlo_shapes():
  text = 'a = bf16[16,1024,768]{2,1,0} b = f32[16,1024,50257] c = s32[]'
  big = plan_lib.largest_tensor(text)
  assert big == {'shape': 'f32[16,1024,50257]', 'bytes': 4 * 16 * 1024 * 50257}


def _smoke(name='mdlm_owt', arg='smoke'):
  import importlib

  return importlib.import_module(f'experiments.configs.{name}').get_config(arg)


def test_vocab_is_known_without_data():
  def vocab(config):
    return plan_lib.vocab_size_of(builders.typed_blocks(config).data)

  assert vocab(_smoke('mdlm_owt', '')) == 50257
  assert vocab(_smoke('mdlm_lm1b', '')) == 30522
  assert vocab(_smoke('md4_text8', '')) == 27
  assert vocab(_smoke()) == 512
  quick = _smoke('quickstart', 'smoke')
  with pytest.raises(ConfigError, match='vocabulary'):
    vocab(quick)


def test_plan_of_a_config_compiles_every_program(tmp_path):
  config = _smoke('bd3_lm1b', '16,smoke')
  plan = plans.write_plan(config, str(tmp_path), 2)
  assert plan['settings']['vocab'] == 512
  assert plan['devices'] == 2
  assert plan['eval_step']['flops'] > 0
  assert plan['sampler_call']['flops'] > 0
  assert plan['tokens_per_step'] == config.train.batch_size * 32
  # The network reads concat(z_t, x): the closed form counts 2L tokens.
  assert plan['flops']['closed_form_train_step'] == pytest.approx(
    plan['flops']['train_step'], rel=0.25
  )
  assert all(v['fits'] for v in plan['fits'].values())
  saved = json.loads((tmp_path / 'plan.json').read_text())
  assert saved['params'] == plan['params']
  assert 'H200' in plan_lib.table(plan)
  row = plan_lib.markdown_rows({'bd3': plan}).splitlines()[-1]
  assert row.startswith(f'| bd3 | 2 | {plan["params"] / 1e6:.1f}M |')


def test_plan_refuses_bad_device_counts():
  config = _smoke()
  with config.unlocked():
    config.mesh.shape = (2, 2, 1)
  with pytest.raises(ConfigError, match='disagrees'):
    plans.devices_needed(config, 8)
  assert plans.devices_needed(config, None) == 4
  with pytest.raises(ConfigError, match='does not split'):
    plans.plan_config(_smoke(), 3)


@pytest.mark.slow
def test_plan_mode_from_the_command_line(tmp_path):
  """experiments.run --mode=plan re-executes itself with fake devices."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.run',
      '--config=experiments/configs/mdlm_owt.py:smoke',
      f'--workdir={tmp_path}',
      '--mode=plan',
      '--devices=2',
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  plan = json.loads((tmp_path / 'plan.json').read_text())
  assert plan['devices'] == 2
  assert 'fits' in out.stdout


def test_device_check_plan_section_compares_plan_and_device():
  from experiments.benchmarks import device_check as dc

  sizes = dc.Sizes.tiny()
  out = dc.plan_check(sizes, dc.Budget(60), 'xla')
  # On CPU the device is the host: planned and compiled are one program.
  assert out['planned_peak_bytes_cpu'] == out['compiled_peak_bytes_here']
  assert out['planned_flops_cpu'] == pytest.approx(
    out['compiled_flops_here'], rel=0.01
  )
  assert out['step_ms'] > 0
  assert 'plan (' in dc.report(
    {'device': 'cpu', 'backend': 'cpu', 'kernels': [], 'plan': out}
  )


def test_plan_of_a_state_tracking_config(tmp_path):
  """Any loop task plans through plan_task: its first batch's shapes."""
  from experiments.configs import state_tracking

  config = state_tracking.get_config('pdssm,parity,smoke')
  assert plans.devices_needed(config, None) == 1
  plan = plans.write_plan(config, str(tmp_path))
  assert plan['devices'] == 1
  assert plan['flops']['train_step'] > 0
  mem = plan['memory_per_device']
  # The best-validation copy of the parameters rides in state.extra.
  assert mem['state_extra'] >= mem['state_params'] > 0
  assert plan['batch_per_device'] == config.train.batch_size
  assert 'v5e' in plan_lib.table(plan)


def test_a_switch_that_does_not_compile_is_recorded_not_suggested():
  """A remat variant that fails to trace (Duo's curriculum, which calls
  the network under lax.cond, does) is reported, and the verdict does not
  suggest remat."""
  spec = _spec(make_mesh((1, 1, 1)))
  working = spec.build

  def build(remat):
    if remat:
      raise ValueError('remat cannot trace here')
    return working(remat)

  spec.build = build
  plan = plan_lib.plan_lm(spec, sections=('remat',))
  assert plan['memory_per_device']['peak_with_remat'] is None
  assert 'cannot trace' in plan['peak_with_remat_error']
  assert 'does not compile' in plan_lib.table(plan)
  fix = {'remat': False, 'grad_accum_steps': 1, 'data': 8, 'fsdp': 1}
  got = plan_lib.switches(10 * 2**30, None, 2 * 2**30, 6 * 2**30, fix)
  assert '--config.model.remat=True' not in got


def test_accumulation_splits_every_devices_rows():
  """On 8 data-parallel devices, 2 micro-batches halve each device's
  activations and keep the step's FLOPs (each micro-batch takes every
  k-th row, so each device's shard splits evenly)."""
  if len(jax.devices()) < 8:
    pytest.skip('needs 8 (fake) devices; tests/conftest.py sets them')
  mesh = make_mesh((8, 1, 1))
  plans = {}
  for accum in (1, 2):
    spec = _spec(mesh, accum_steps=accum)
    spec.batch_size = 64
    plans[accum] = plan_lib.plan_lm(spec, sections=())
  one, two = plans[1], plans[2]
  assert two['flops']['train_step'] == pytest.approx(
    one['flops']['train_step'], rel=0.05
  )
  act = lambda p: p['memory_per_device']['activations_and_temporaries']
  assert act(two) < 0.75 * act(one)
  assert two['largest_tensor_per_device']['bytes'] == (
    one['largest_tensor_per_device']['bytes'] // 2
  )


def test_plan_of_a_planner_executor_config(tmp_path):
  """Each role the pipeline trains is planned as its own loop task."""
  from experiments.configs import planner_executor

  config = planner_executor.get_config('latent,smoke')
  plan = plans.write_plan(config, str(tmp_path))
  assert plan['roles']
  for role, p in plan['roles'].items():
    assert p['flops']['train_step'] > 0, role
    assert p['memory_per_device']['peak'] > 0, role
  text = plan_lib.table(plan)
  assert all(f'role {r}:' in text for r in plan['roles'])
  assert json.loads((tmp_path / 'plan.json').read_text())['roles']
