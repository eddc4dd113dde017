"""Sharding: a (data=2, fsdp=2, tensor=2) mesh matches one device."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.parallel import make_mesh
from ddlm_jax.parallel.mesh import resolve_mesh_shape
from ddlm_jax.parallel.rules import DEFAULT_RULES, logical_to_spec
from ddlm_jax.training.optimizer import make_optimizer
from ddlm_jax.training.state import init_train_state
from ddlm_jax.training.steps import jit_train_step, loss_fn

CFG = TransformerConfig(
  vocab_size=16, input_vocab_size=17, width=32, depth=1, num_heads=2
)
PROCESS = MaskedDiffusion(get_schedule('loglinear'), 16, t_min=1e-3)


def _setup(shape):
  mesh = make_mesh(shape)
  tx, _ = make_optimizer(learning_rate=1e-2, warmup_steps=1, total_steps=10)
  graphdef, state, shardings = init_train_state(
    lambda rngs: Transformer(CFG, rngs=rngs),
    tx,
    seed=0,
    mesh=mesh,
    use_ema=True,
  )
  return mesh, tx, graphdef, state, shardings


@pytest.fixture(scope='module')
def tokens():
  return jax.random.randint(jax.random.key(0), (8, 16), 0, 16)


def test_fake_devices_available():
  assert jax.device_count() == 8


def _loss_and_grads(shape, tokens):
  _, _, graphdef, state, shardings = _setup(shape)
  grad_fn = jax.jit(
    jax.value_and_grad(
      functools.partial(loss_fn, graphdef=graphdef, process=PROCESS)
    ),
    in_shardings=(shardings.params, None, None),
  )
  loss, grads = grad_fn(state.params, jax.random.key(1), tokens)
  return loss, grads, state


@pytest.fixture(scope='module')
def single_device(tokens):
  return _loss_and_grads((1, 1, 1), tokens)


@pytest.mark.parametrize(
  'layout', [(2, 2, 2), (8, 1, 1), (1, 8, 1), (1, 4, 2), (2, 1, 4)]
)
def test_sharded_loss_and_grads_equal_single_device(
  tokens, single_device, layout
):
  """Data, FSDP, tensor and mixed layouts all give one device's numbers."""
  l1, g1, _ = single_device
  l8, g8, s8 = _loss_and_grads(layout, tokens)
  np.testing.assert_allclose(l1, l8, rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
    g1,
    g8,
  )
  if layout == (2, 2, 2):  # Parameters really are split on this mesh.
    kernel = s8.params['blocks'][0]['mlp']['up']['kernel']
    spec = jax.sharding.PartitionSpec('fsdp', 'tensor')
    assert kernel.sharding.spec == spec
    assert kernel.addressable_shards[0].data.shape == (16, 64)


@pytest.mark.slow
def test_sharded_train_steps_equal_single_device(tokens):
  finals = []
  for shape in [(1, 1, 1), (2, 2, 2)]:
    mesh, tx, graphdef, state, shardings = _setup(shape)
    step = jit_train_step(graphdef, PROCESS, tx, 0.9, shardings, mesh)
    for _ in range(3):
      state, metrics = step(state, {'tokens': tokens})
    finals.append((state, metrics))
  (s1, m1), (s8, m8) = finals
  np.testing.assert_allclose(m1['loss'], m8['loss'], rtol=1e-5)
  # Adam divides by sqrt(v): reduction-order noise of ~1e-7 in a tiny
  # gradient can move a parameter by up to ~1e-5 after steps of size 1e-2.
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4),
    s1.params,
    s8.params,
  )


def test_mesh_shape_resolution_and_errors():
  assert resolve_mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
  with pytest.raises(ValueError, match='at most one'):
    resolve_mesh_shape((-1, -1, 1), 8)
  with pytest.raises(ValueError, match='divisible'):
    resolve_mesh_shape((-1, 3, 1), 8)
  with pytest.raises(ValueError, match='one size per axis'):
    resolve_mesh_shape((8,), 8)


def test_indivisible_dims_are_replicated_not_errors():
  mesh = make_mesh((2, 2, 2))
  assert logical_to_spec(('vocab', 'embed'), (17, 32), mesh) == (
    jax.sharding.PartitionSpec(None, 'fsdp')
  )
  with pytest.raises(KeyError, match='no sharding rule'):
    logical_to_spec(('nonexistent',), (4,), mesh)


def test_rules_cover_every_mesh_axis_name():
  mesh_axes = {'data', 'fsdp', 'tensor'}
  for name, axes in DEFAULT_RULES.items():
    flat = () if axes is None else ((axes,) if isinstance(axes, str) else axes)
    assert set(flat) <= mesh_axes, name


def test_batch_rule_splits_batch():
  mesh = make_mesh((2, 2, 2))
  x = jax.device_put(
    jnp.zeros((8, 4)),
    jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(('data', 'fsdp'))
    ),
  )
  assert x.addressable_shards[0].data.shape == (2, 4)


def test_experts_split_over_the_tensor_axis_and_match_one_device():
  from flax import nnx

  from ddlm_jax.models.moe import Experts, TopKRouter
  from ddlm_jax.training.state import module_init, param_shardings, split_model

  class MoE(nnx.Module):
    def __init__(self, *, rngs):
      self.router = TopKRouter(32, 4, 2, rngs=rngs)
      self.experts = Experts(32, 16, 4, rngs=rngs)

    def __call__(self, x_NxD):
      return self.experts(x_NxD, *self.router(x_NxD))

  graphdef, abstract = split_model(MoE)
  mesh = make_mesh((2, 2, 2))
  shardings = param_shardings(abstract, mesh)
  P = jax.sharding.PartitionSpec
  assert shardings['experts']['gate_up'].spec == P('tensor', 'fsdp', None)
  assert shardings['experts']['down'].spec == P('tensor', None, 'fsdp')
  params = module_init(MoE)(jax.random.key(0))
  x_NxD = jax.random.normal(jax.random.key(1), (8, 32))

  def apply(p, x):
    return nnx.merge(graphdef, nnx.State(p))(x)

  want = jax.jit(apply)(params, x_NxD)
  sharded = jax.device_put(params, shardings)
  shard = sharded['experts']['gate_up'].addressable_shards[0].data.shape
  assert shard == (2, 16, 32)  # 4 experts over 2, width 32 over 2
  got = jax.jit(apply)(sharded, x_NxD)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def _step_flops(shape):
  from ddlm_jax.training.steps import jit_train_step

  mesh, tx, graphdef, state, shardings = _setup(shape)
  step = jit_train_step(graphdef, PROCESS, tx, 0.9, shardings, mesh)
  batch = jnp.zeros((8, 16), jnp.int32)
  compiled = step.lower(state, {'tokens': batch}).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost['flops'])


def test_fsdp_step_splits_the_batch_like_data_parallel():
  # Each device computes its own rows under fsdp as under data parallelism
  # (per-device FLOPs of the compiled step): had XLA carried the weights'
  # width split into the activations and gathered the batch, every device
  # would compute all 8 rows.
  data, fsdp = _step_flops((8, 1, 1)), _step_flops((1, 8, 1))
  assert fsdp < 1.5 * data, (fsdp, data)
