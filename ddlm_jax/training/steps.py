"""Pure train and eval steps: (state, batch) -> (state, metrics).

The process (masked diffusion or AR) supplies the loss; the model is merged
from its graph definition and the parameter dict inside the step, so the same
step serves every process and backbone.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ddlm_jax.training.state import TrainState


def make_apply(graphdef, params):
  """apply(z_BxL, t_B) -> logits_BxLxV for a parameter dict."""
  model = nnx.merge(graphdef, params)
  return lambda z_BxL, t_B: model(z_BxL, t_B)


def _loss_and_metrics(params, graphdef, process, key, x_BxL):
  objective_B, nelbo_B, aux = process.loss(
    make_apply(graphdef, params), key, x_BxL
  )
  length = x_BxL.shape[1]
  loss = objective_B.mean() / length
  metrics = {'loss': loss, 'nelbo_per_token': nelbo_B.mean() / length}
  for name, value in aux.items():
    metrics[name] = jnp.mean(value)
  return loss, metrics


def _tree_all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves))


def train_step(
  state: TrainState,
  batch: dict,
  *,
  graphdef,
  process,
  tx: optax.GradientTransformation,
  ema_decay: float,
):
  """One optimiser step; non-finite loss or gradients freeze the state."""
  rng, key = jax.random.split(state.rng)
  x_BxL = batch['tokens']
  grad_fn = jax.value_and_grad(_loss_and_metrics, has_aux=True)
  (loss, metrics), grads = grad_fn(state.params, graphdef, process, key, x_BxL)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ema = state.ema_params
  if ema is not None:
    ema = jax.tree.map(
      lambda e, p: ema_decay * e + (1.0 - ema_decay) * p, ema, params
    )
  finite = jnp.isfinite(loss) & _tree_all_finite(grads)
  healthy = finite & (state.bad_step < 0)
  keep = lambda new, old: jax.tree.map(
    lambda n, o: jnp.where(healthy, n, o), new, old
  )
  new_state = TrainState(
    step=state.step + healthy.astype(jnp.int32),
    params=keep(params, state.params),
    opt_state=keep(opt_state, state.opt_state),
    ema_params=None if ema is None else keep(ema, state.ema_params),
    rng=rng,
    bad_step=jnp.where(
      (state.bad_step < 0) & ~finite, state.step + 1, state.bad_step
    ),
  )
  metrics['grad_norm'] = optax.global_norm(grads)
  return new_state, metrics


def jit_train_step(graphdef, process, tx, ema_decay, state_shardings, mesh):
  """train_step under jit with explicit shardings and a donated state."""
  from ddlm_jax.parallel import batch_sharding, replicated

  step = functools.partial(
    train_step, graphdef=graphdef, process=process, tx=tx, ema_decay=ema_decay
  )
  return jax.jit(
    step,
    in_shardings=(state_shardings, {'tokens': batch_sharding(mesh)}),
    out_shardings=(state_shardings, replicated(mesh)),
    donate_argnums=(0,),
  )


def loss_fn(params, key, x_BxL, *, graphdef, process):
  """Scalar training loss (used by tests to compare gradients)."""
  return _loss_and_metrics(params, graphdef, process, key, x_BxL)[0]
