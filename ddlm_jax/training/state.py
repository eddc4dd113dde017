"""Train state as a plain pytree, and its sharded initialisation.

Parameters are pure dicts split from the NNX module, so the state is an
ordinary pytree that jit, optax and orbax handle directly; the module's
graph definition is kept apart and merged back inside the pure steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ddlm_jax.parallel import rules as rules_lib


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  ema_params: Any  # None when EMA is off.
  rng: jax.Array
  # First step whose loss or gradients were not finite; -1 while all is well.
  # Once set, updates are skipped so the state stays at the last good one.
  bad_step: jax.Array
  # Task-owned pytree carried and checkpointed with the state (e.g. the
  # best-validation parameters of state tracking); None when unused.
  extra: Any = None


def abstract_state(state, shardings):
  """ShapeDtypeStructs with shardings: the restore target of a state."""
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
    state,
    shardings,
  )


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def eval_params(state: TrainState, use_ema: bool):
  """The EMA parameters when asked for and kept, else the raw ones."""
  if use_ema and state.ema_params is not None:
    return state.ema_params
  return state.params


def split_model(build: Callable[[], nnx.Module]):
  """(graphdef, abstract nnx State of Params) without allocating weights."""
  abstract = nnx.eval_shape(lambda: build(rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract, nnx.Param)
  return graphdef, abstract_state


def param_shardings(abstract_state, mesh, rules=rules_lib.DEFAULT_RULES):
  """Pure dict of NamedShardings matching nnx.to_pure_dict(params)."""
  flat = {}
  for path, variable in nnx.to_flat_state(abstract_state):
    names = rules_lib.logical_names(variable)
    shape = variable.shape
    if len(names) != len(shape):
      names = (None,) * len(shape)
    spec = rules_lib.logical_to_spec(names, shape, mesh, rules)
    flat[path] = jax.sharding.NamedSharding(mesh, spec)
  return nnx.to_pure_dict(nnx.from_flat_state(flat))


def module_init(build: Callable[[], nnx.Module]):
  """init(key) -> pure parameter dict of the module `build` makes."""

  def init(key):
    model = build(rngs=nnx.Rngs(params=key))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))

  return init


def fresh_state(
  init: Callable[[jax.Array], Any],
  tx: optax.GradientTransformation,
  rng: jax.Array,
  *,
  use_ema: bool,
  init_extra: Callable[[Any], Any] | None = None,
) -> TrainState:
  """The TrainState at step 0 (traceable: jit it with out_shardings, or
  eval_shape it for shapes only)."""
  params = init(rng)
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    ema_params=params if use_ema else None,
    rng=jax.random.fold_in(rng, 1),
    bad_step=jnp.full((), -1, jnp.int32),
    extra=None if init_extra is None else init_extra(params),
  )


def init_state(
  init: Callable[[jax.Array], Any],
  tx: optax.GradientTransformation,
  *,
  seed: int,
  mesh,
  use_ema: bool,
  param_shardings=None,
  init_extra: Callable[[Any], Any] | None = None,
):
  """Creates a TrainState directly in its shardings; (state, shardings).

  `init(key)` returns the parameter dict and must be traceable: it runs
  under jit with the output shardings, so weights are allocated where they
  live. `param_shardings` defaults to replicated parameters.
  """

  def make(rng):
    return fresh_state(init, tx, rng, use_ema=use_ema, init_extra=init_extra)

  rng = jax.random.key(seed)
  abstract_train = jax.eval_shape(make, rng)
  if param_shardings is None:
    repl = rules_lib.replicated(mesh)
    param_shardings = jax.tree.map(lambda _: repl, abstract_train.params)
  shardings = train_state_shardings(abstract_train, param_shardings, mesh)
  state = jax.jit(make, out_shardings=shardings)(rng)
  return state, shardings


def init_train_state(
  build: Callable[[], nnx.Module],
  tx: optax.GradientTransformation,
  *,
  seed: int,
  mesh,
  use_ema: bool,
  rules=rules_lib.DEFAULT_RULES,
):
  """init_state for an NNX builder, sharded by its logical axes.

  `build(rngs=...)` constructs the module; seeding its Rngs from a traced
  key lets initialisation run inside jit with output shardings.
  Returns (graphdef, state, state_shardings).
  """
  graphdef, abstract_state = split_model(build)
  init = module_init(build)
  state, shardings = init_state(
    init,
    tx,
    seed=seed,
    mesh=mesh,
    use_ema=use_ema,
    param_shardings=param_shardings(abstract_state, mesh, rules),
  )
  return graphdef, state, shardings


def train_state_shardings(abstract_train: TrainState, p_shard, mesh):
  """Shardings for every leaf: parameter-shaped trees follow the params."""
  repl = rules_lib.replicated(mesh)
  p_struct = jax.tree.structure(p_shard)

  def like_params(tree):
    # optax states hold param-shaped subtrees (mu, nu) next to scalars.
    if tree is None:
      return None
    if jax.tree.structure(tree) == p_struct:
      return p_shard
    if hasattr(tree, '_fields'):  # NamedTuple
      return type(tree)(*[like_params(t) for t in tree])
    if isinstance(tree, (tuple, list)):
      return type(tree)(like_params(t) for t in tree)
    if isinstance(tree, dict):
      return {k: like_params(v) for k, v in tree.items()}
    return jax.tree.map(lambda _: repl, tree)

  return TrainState(
    step=repl,
    params=p_shard,
    opt_state=like_params(abstract_train.opt_state),
    ema_params=p_shard if abstract_train.ema_params is not None else None,
    rng=repl,
    bad_step=repl,
    extra=like_params(abstract_train.extra),
  )
