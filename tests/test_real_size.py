"""mdlm_owt.py's model at its real size, trained and sampled on fake CPUs.

The paper configs otherwise run only as smoke presets; this runs the model
of ``experiments/configs/mdlm_owt.py`` (12 x 768, vocabulary 50257,
L = 1024, bf16 compute, AdamW with EMA) on 8 fake CPU devices: two
training steps, one eval step, one sampler call, a checkpoint restored
onto a mesh that cuts every weight differently, and step 1's loss computed
again on one device.

Layouts (``DDLM_REAL_SIZE_MESH``; the config's own is not the default
because its 8 replicas of the train state do not fit a 23 GB host):

* ``fsdp_tp`` (the default): mesh (1, 4, 2), the train state sharded
  four ways by fsdp and two by tensor parallelism, ``model.remat`` on, 4
  rows (one per fsdp group); restored onto (1, 8, 1). The smallest
  per-device step found: 2.03 GB at L = 1024.
* ``fsdp``: mesh (1, 8, 1), one row per device, remat on; restored onto
  (1, 4, 2). 2.45 GB per device.
* ``config``: the config's own mesh (-1, 1, 1) = (8, 1, 1), data parallel
  with the train state replicated on every device, and the library's
  `steps.jit_train_step` as it is; restored onto (1, 4, 2). Right for
  the accelerators the config targets (16 sequences on each 80-95 GB chip);
  on fake CPU devices the 8 replicas share one host: 5.64 GB per device,
  ~45 GB in all.

In the fsdp layouts every program gathers the weights for compute
(`compute_params`: the parameters constrained to their shardings without
the fsdp axis, i.e. ZeRO-3's gather; gradients are reduce-scattered back).
Without that constraint XLA's sharding propagation carries the width split
of the weights into the activations and gathers the batch instead: every
device then runs all 8 rows (its logits are f32[8192, 50257]) and the
(1, 8, 1) step compiles to 3.67 GB per device instead of 2.45 GB (XLA:CPU,
L = 1024, remat on, the memory-optimised scheduler of the command below,
which XLA:CPU takes from XLA_FLAGS only, not from jit's compiler_options).

The 8 fake devices share the host's memory, and XLA:CPU allocates each
device's temporaries for the whole program, so the host needs about 8x
the per-device peak: ~17 GB at L = 1024 even for ``fsdp_tp`` (the f32
logits of a row are 196 MiB per copy, the gathered embedding and head and
their gradients 147 MiB each, and XLA:CPU keeps every layer's attention
probabilities despite remat). ``DDLM_REAL_SIZE_SEQ_LEN`` runs the same
model on shorter rows where a host cannot hold that (docs/LAUNCH.md
section 7.1 has the figures):

  XLA_FLAGS="--xla_force_host_platform_device_count=8 \\
    --xla_cpu_enable_concurrency_optimized_scheduler=false" \\
  DDLM_REAL_SIZE=1 python -m pytest -q -m real_size tests/test_real_size.py

``DDLM_REAL_SIZE_RECORD=FILE.json`` writes each phase's wall time and the
host RSS (peak so far and current) as the run goes.

Without ``DDLM_REAL_SIZE=1`` the same tests run as a rehearsal in the
chosen layout (marked slow): the real 50257-id vocabulary, which no mesh
axis divides, on a 2 x 64 network with L = 32.

Tolerances: the train step's loss on the sharded mesh equals the loss of
the same parameters, key and batch computed on one device (forward only)
within a relative 1e-3 (the same per-row arithmetic in bf16; only the
reduction order of the final mean and XLA's matmul tiling differ);
restored values equal the saved ones exactly; the eval NELBO on the
restore mesh equals the one on the training mesh within a relative 1e-3.
"""

import dataclasses
import json
import os
import resource
import time

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ddlm_jax.parallel import batch_sharding, make_mesh, replicated
from ddlm_jax.sampling.ancestral import ancestral_sample
from ddlm_jax.tasks import plans
from ddlm_jax.training import plan as plan_lib
from ddlm_jax.training import steps
from ddlm_jax.training.checkpoint import Checkpointer
from ddlm_jax.training.config import ConfigError
from ddlm_jax.training.state import (
  init_train_state,
  module_init,
  split_model,
)
from experiments.configs import mdlm_owt

REAL_SIZE = os.environ.get('DDLM_REAL_SIZE') == '1'
LAYOUT = os.environ.get('DDLM_REAL_SIZE_MESH', 'fsdp_tp')
SEQ_LEN = int(os.environ.get('DDLM_REAL_SIZE_SEQ_LEN', '1024'))
RECORD = os.environ.get('DDLM_REAL_SIZE_RECORD', '')
SIZES = {
  # The paper model (opt-in: see the module docstring for its memory).
  'real': {'seq_len': SEQ_LEN},
  # The same code path at a size the default suite can afford: the real
  # 50257-id vocabulary (which no mesh axis divides), a narrow network.
  'rehearsal': {'width': 64, 'depth': 2, 'num_heads': 2, 'seq_len': 32},
}


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the run's arrays live: the training mesh (None: the config's,
  with its remat), rows per training batch, whether programs gather the
  weights for compute, the mesh the checkpoint is restored onto, and the
  eval batch's rows (on both meshes)."""

  mesh: tuple[int, int, int] | None
  remat: bool | None
  rows: int
  gather: bool
  restore_mesh: tuple[int, int, int]
  eval_rows: int = 8  # Splits over the data ways of both meshes.


LAYOUTS = {
  # Four-way fsdp, two-way tensor parallelism, one row per fsdp group:
  # the smallest per-device program found (docs/LAUNCH.md section 7.1).
  'fsdp_tp': Layout((1, 4, 2), True, 4, True, (1, 8, 1)),
  # Two-way fsdp, four-way tensor parallelism, two rows: half the
  # activations of fsdp_tp, for a 23 GB host at L 1024; restored onto
  # eight-way tensor parallelism (12 heads do not split 8 ways: those
  # weights are replicated there).
  'tp4': Layout((1, 2, 4), True, 2, True, (1, 1, 8), eval_rows=2),
  # Eight-way fsdp, one row per device.
  'fsdp': Layout((1, 8, 1), True, 8, True, (1, 4, 2)),
  # The config's own mesh, (-1, 1, 1), and the library's train step.
  'config': Layout(None, None, 8, False, (1, 4, 2)),
}
REL_TOL = 1e-3
SEED = 0  # init_train_state seeds the parameters with jax.random.key(SEED).


def _config(size: str):
  if LAYOUT not in LAYOUTS:
    raise ConfigError(
      f'DDLM_REAL_SIZE_MESH={LAYOUT!r}: use one of {sorted(LAYOUTS)}.'
    )
  c = mdlm_owt.get_config()
  layout = LAYOUTS[LAYOUT]
  c.train.batch_size = layout.rows
  c.eval.batch_size = layout.eval_rows
  if layout.mesh is not None:
    c.mesh.shape = layout.mesh
    c.model.remat = layout.remat
  for key, value in SIZES[size].items():
    if key == 'seq_len':
      c.data.seq_len = value
    else:
      c.model[key] = value
  return c


def _tokens(seed: int, vocab: int, length: int, rows: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(
    0, vocab, (rows or LAYOUTS[LAYOUT].rows, length), dtype=np.int32
  )


def _without_fsdp(sharding: NamedSharding) -> NamedSharding:
  """The sharding with its fsdp split dropped (tensor splits kept)."""
  parts = []
  for axes in sharding.spec:
    if axes == 'fsdp':
      axes = None
    elif isinstance(axes, tuple):
      axes = tuple(a for a in axes if a != 'fsdp') or None
    parts.append(axes)
  return NamedSharding(sharding.mesh, P(*parts))


def compute_params(param_shardings, gather: bool):
  """params -> the parameters a program computes with: gathered over the
  fsdp axis when `gather` (ZeRO-3: weights whole for the forward, their
  gradients reduce-scattered back), else as they are."""
  if not gather:
    return lambda params: params
  whole = jax.tree.map(_without_fsdp, param_shardings)
  return lambda params: jax.lax.with_sharding_constraint(params, whole)


def _train_step(graphdef, process, spec, shardings, mesh, gather: bool):
  if not gather:
    return steps.jit_train_step(
      graphdef, process, spec.tx, spec.ema_decay, shardings, mesh
    )
  loss = steps.lm_loss(graphdef, process)
  whole = compute_params(shardings.params, gather)
  return steps.jit_step(
    lambda params, key, batch: loss(whole(params), key, batch),
    spec.tx,
    spec.ema_decay,
    shardings,
    mesh,
    weight=steps.lm_weight,
    uses_step=process.uses_step,
  )


def _eval_fn(graphdef, process, param_shardings, mesh, gather: bool):
  loss = steps.lm_loss(graphdef, process.evaluation_process)
  whole = compute_params(param_shardings, gather)

  def nelbo(params, key, batch):
    return loss(whole(params), key, batch)[1]['nelbo_per_token']

  return jax.jit(
    nelbo,
    in_shardings=(param_shardings, replicated(mesh), batch_sharding(mesh)),
    out_shardings=replicated(mesh),
  )


def _host_sums(tree) -> list[float]:
  """Per-leaf float64 sums (keys by their key data)."""

  def total(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    return float(np.asarray(x, np.float64).sum())

  return [total(x) for x in jax.tree.leaves(tree)]


def _rss_bytes() -> int:
  """The process's resident memory now (Linux; 0 elsewhere)."""
  try:
    with open('/proc/self/statm') as f:
      return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
  except (OSError, ValueError, IndexError):
    return 0


class _Phases:
  """Wall time of each phase and the host's peak RSS after it."""

  def __init__(self):
    self.rows = []
    self._t = time.perf_counter()

  def mark(self, name: str):
    now = time.perf_counter()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    self.rows.append(
      {
        'phase': name,
        'seconds': round(now - self._t, 1),
        'peak_rss_gib': round(peak_kib / 2**20, 2),
        'rss_gib': round(_rss_bytes() / 2**30, 2),
      }
    )
    self._t = now
    if RECORD:  # Kept as it goes: a run stopped midway still says where.
      with open(RECORD + '.phases', 'w') as f:
        json.dump(self.rows, f, indent=2)


@pytest.fixture(
  scope='module',
  params=[
    pytest.param('rehearsal', marks=pytest.mark.slow),
    pytest.param(
      'real',
      marks=[
        pytest.mark.real_size,
        pytest.mark.slow,
        pytest.mark.skipif(
          not REAL_SIZE,
          reason='the real size needs ~17 GB of host memory (fsdp_tp layout) '
          'and many minutes: set DDLM_REAL_SIZE=1 to run it',
        ),
      ],
    ),
  ],
)
def trained(request, tmp_path_factory):
  """Two steps on the layout's mesh, the reference loss, an eval, a
  sampler call, a checkpoint."""
  assert len(jax.devices()) >= 8, 'needs 8 fake devices (tests/conftest.py)'
  size = request.param
  phases = _Phases()
  config = _config(size)
  gather = LAYOUTS[LAYOUT].gather
  mesh = make_mesh(config.mesh.shape)
  assert int(np.prod(list(mesh.shape.values()))) == 8
  spec = plans.spec_from_config(config, mesh)
  process = spec.process
  if size == 'real':
    assert spec.settings['width'] == 768 and spec.settings['depth'] == 12
    assert spec.seq_len == SEQ_LEN and spec.settings['dtype'] == 'bfloat16'
  assert process.vocab_size == 50257
  graphdef, state, shardings = init_train_state(
    spec.build(spec.remat),
    spec.tx,
    seed=SEED,
    mesh=mesh,
    use_ema=spec.ema_decay > 0,
  )
  vocab, length = process.vocab_size, spec.seq_len
  batches = [
    {'tokens': jax.device_put(_tokens(i, vocab, length), batch_sharding(mesh))}
    for i in range(2)
  ]
  phases.mark('init')

  # Step 1's key (train_step splits state.rng) and the initial
  # parameters' sums: the one-device reference below rebuilds both.
  key_data = np.asarray(jax.random.key_data(jax.random.split(state.rng)[1]))
  init_sums = _host_sums(state.params)

  train_step = _train_step(graphdef, process, spec, shardings, mesh, gather)
  metrics = []
  for i, batch in enumerate(batches):
    state, m = train_step(state, batch)
    metrics.append(jax.device_get(m))
    phases.mark(f'train_step_{i + 1}')
  del train_step, batches
  jax.clear_caches()

  eval_key = jax.random.key(7)
  eval_batch = {
    'tokens': jax.device_put(
      _tokens(2, vocab, length, LAYOUTS[LAYOUT].eval_rows),
      batch_sharding(mesh),
    )
  }
  evaluate = _eval_fn(graphdef, process, shardings.params, mesh, gather)
  nelbo = float(evaluate(state.params, eval_key, eval_batch))
  del evaluate, eval_batch
  jax.clear_caches()
  phases.mark('eval_step')

  ckpt_dir = str(tmp_path_factory.mktemp('real_size') / 'checkpoints')
  ck = Checkpointer(ckpt_dir, async_=False)
  assert ck.save(2, state, None)
  ck.close()
  saved = {
    'step': int(state.step),
    'bad_step': int(state.bad_step),
    'params': jax.device_get(state.params),
    'sums': _host_sums(state),
  }
  # The sampler needs only the parameters: the optimizer state and EMA
  # are freed before it runs.
  params = state.params
  del state
  phases.mark('checkpoint_save')

  whole = compute_params(shardings.params, gather)
  # Sampling needs no backward pass, and a remat-built network does not
  # trace inside the sampler's loop (nnx refuses the cross-trace merge):
  # the same parameters in the graph built without remat.
  forward_graphdef = split_model(spec.build(False))[0]

  def sample(params, key):
    apply = steps.make_apply(forward_graphdef, whole(params))
    return ancestral_sample(
      apply,
      key,
      process,
      batch=LAYOUTS[LAYOUT].rows,
      length=length,
      num_steps=2,
      use_cache=False,
    )

  tokens_BxL, nfe = jax.jit(
    sample,
    in_shardings=(shardings.params, replicated(mesh)),
    out_shardings=(batch_sharding(mesh), replicated(mesh)),
  )(params, jax.random.key(3))
  samples = np.asarray(jax.device_get(tokens_BxL))
  del params
  jax.clear_caches()
  phases.mark('sampler_call')

  # The one-device reference of step 1's loss (forward only), computed
  # last so that its buffers never sit beside the sharded run's: the same
  # initial parameters (rebuilt from the same seed, checked by their sums),
  # key and batch.
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  params_one = jax.jit(module_init(spec.build(False)), out_shardings=one)(
    jax.random.key(SEED)
  )
  assert _host_sums(params_one) == init_sums
  loss_one = jax.jit(
    lambda p, k, x: steps.loss_fn(p, k, x, graphdef=graphdef, process=process)
  )(
    params_one,
    jax.device_put(jax.random.wrap_key_data(key_data), one),
    jax.device_put(_tokens(0, vocab, length), one),
  )
  loss_one = float(loss_one)
  del params_one
  jax.clear_caches()
  phases.mark('one_device_loss')
  result = {
    'spec': spec,
    'graphdef': graphdef,
    'gather': gather,
    'train_mesh': dict(mesh.shape),
    'metrics': metrics,
    'loss_one': loss_one,
    'nelbo': nelbo,
    'eval_key': eval_key,
    'eval_tokens': _tokens(2, vocab, length, LAYOUTS[LAYOUT].eval_rows),
    'samples': samples,
    'nfe': int(nfe),
    'ckpt_dir': ckpt_dir,
    'saved': saved,
    'phases': phases,
  }
  yield result
  if RECORD and size == 'real':
    with open(RECORD, 'w') as f:
      json.dump(
        {
          'layout': LAYOUT,
          'mesh': list(config.mesh.shape),
          'remat': spec.remat,
          'seq_len': length,
          'rows': LAYOUTS[LAYOUT].rows,
          'loss_sharded': float(metrics[0]['loss']),
          'loss_one_device': loss_one,
          'nelbo_train_mesh': nelbo,
          'nelbo_restore_mesh': result.get('nelbo_restored'),
          'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'phases': phases.rows,
        },
        f,
        indent=2,
      )


def test_two_train_steps_are_finite_and_advance(trained):
  saved = trained['saved']
  assert saved['step'] == 2 and saved['bad_step'] == -1
  for m in trained['metrics']:
    for name in ('loss', 'nelbo_per_token', 'grad_norm'):
      assert np.isfinite(m[name]), (name, m[name])
    assert m['grad_norm'] > 0
  # An untrained model over 50257 ids: the per-token bound is near log V
  # (MDLM's loss weighs the masked tokens by 1/t, so it is of that order).
  first = float(trained['metrics'][0]['nelbo_per_token'])
  assert 1.0 < first < 5 * np.log(50257)


def test_sharded_loss_equals_single_device_loss(trained):
  sharded = float(trained['metrics'][0]['loss'])
  np.testing.assert_allclose(sharded, trained['loss_one'], rtol=REL_TOL)


def test_eval_step_and_sampler_call(trained):
  assert np.isfinite(trained['nelbo']) and trained['nelbo'] > 0
  samples = trained['samples']
  process = trained['spec'].process
  assert samples.shape == (LAYOUTS[LAYOUT].rows, trained['spec'].seq_len)
  # Every position is revealed and holds a real token (not the mask id).
  assert samples.min() >= 0 and samples.max() < process.vocab_size
  assert trained['nfe'] >= 1


def test_checkpoint_restores_onto_another_mesh(trained):
  spec = trained['spec']
  mesh = make_mesh(LAYOUTS[LAYOUT].restore_mesh)
  graphdef, target, shardings = plan_lib.abstract_train(
    spec.build(spec.remat), spec.tx, mesh, spec.ema_decay > 0
  )
  ck = Checkpointer(trained['ckpt_dir'], read_only=True)
  state, data, step = ck.restore_latest(target)
  ck.close()
  saved = trained['saved']
  assert step == 2 and data in (None, {})
  assert int(state.step) == saved['step']
  for got, want in zip(
    jax.tree.leaves(state.params), jax.tree.leaves(saved['params'])
  ):
    assert got.sharding.mesh.shape == mesh.shape
    np.testing.assert_array_equal(np.asarray(got), want)
  assert _host_sums(state) == saved['sums']
  # A weight of width x vocab is cut only by fsdp here (vocab 50257 does
  # not split two ways), which the training mesh cuts another way.
  ways = mesh.shape['fsdp']
  assert ways != trained['train_mesh']['fsdp']
  embed = [x for x in jax.tree.leaves(state.params) if 50257 in x.shape]
  assert embed and all(
    x.addressable_shards[0].data.size * ways == x.size for x in embed
  )
  trained['phases'].mark('restore')
  evaluate = _eval_fn(
    graphdef, spec.process, shardings.params, mesh, trained['gather']
  )
  batch = {
    'tokens': jax.device_put(trained['eval_tokens'], batch_sharding(mesh))
  }
  nelbo = float(evaluate(state.params, trained['eval_key'], batch))
  trained['nelbo_restored'] = nelbo
  trained['phases'].mark('eval_on_restore_mesh')
  np.testing.assert_allclose(nelbo, trained['nelbo'], rtol=REL_TOL)
