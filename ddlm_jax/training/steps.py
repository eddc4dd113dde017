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
  """The model for a parameter dict: apply(z_BxL, t_B) -> logits_BxLxV.

  The merged module itself, so processes and samplers can reach extra
  entry points (soft-masking's feedback) where the model has them.
  """
  return nnx.merge(graphdef, params)


def _num_tokens(x_BxL, loss_mask_BxL):
  if loss_mask_BxL is None:
    return jnp.float32(x_BxL.size)
  return jnp.maximum(loss_mask_BxL.sum(), 1.0)


def _loss_and_metrics(params, graphdef, process, key, x_BxL, loss_mask_BxL):
  """Per-token loss: sums over sequences divided by the real tokens."""
  objective_B, nelbo_B, aux = process.loss(
    make_apply(graphdef, params), key, x_BxL, loss_mask_BxL
  )
  tokens = _num_tokens(x_BxL, loss_mask_BxL)
  loss = objective_B.sum() / tokens
  metrics = {'loss': loss, 'nelbo_per_token': nelbo_B.sum() / tokens}
  for name, value in aux.items():
    metrics[name] = jnp.mean(value)
  return loss, metrics


def _grads(params, graphdef, process, key, batch, accum_steps: int):
  """Loss, metrics and gradients, over `accum_steps` micro-batches.

  Micro-batches run in a lax.scan so activations of one micro-batch at a
  time are live; gradients and metrics are averaged (each micro-batch has the
  same number of sequences).
  """
  grad_fn = jax.value_and_grad(_loss_and_metrics, has_aux=True)
  x_BxL, mask_BxL = batch['tokens'], batch.get('loss_mask')
  if accum_steps == 1:
    (_, metrics), grads = grad_fn(
      params, graphdef, process, key, x_BxL, mask_BxL
    )
    return metrics, grads
  batch_size = x_BxL.shape[0]
  if batch_size % accum_steps:
    raise ValueError(
      f'batch of {batch_size} does not split into {accum_steps} '
      'micro-batches; change optim.grad_accum_steps or data.batch_size.'
    )
  split = lambda a: a.reshape(accum_steps, batch_size // accum_steps, -1)
  micro = {'x': split(x_BxL)}
  if mask_BxL is not None:
    micro['mask'] = split(mask_BxL)

  def body(carry, inputs):
    i, mb = inputs
    (_, metrics), grads = grad_fn(
      params,
      graphdef,
      process,
      jax.random.fold_in(key, i),
      mb['x'],
      mb.get('mask'),
    )
    carry = jax.tree.map(jnp.add, carry, (metrics, grads))
    return carry, None

  zeros = jax.eval_shape(
    lambda: grad_fn(params, graphdef, process, key, micro['x'][0], None)
  )
  init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
  init = (init[0][1], init[1])
  (metrics, grads), _ = jax.lax.scan(
    body, init, (jnp.arange(accum_steps), micro)
  )
  mean = lambda t: jax.tree.map(lambda v: v / accum_steps, t)
  return mean(metrics), mean(grads)


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
  accum_steps: int = 1,
):
  """One optimiser step; non-finite loss or gradients freeze the state."""
  rng, key = jax.random.split(state.rng)
  metrics, grads = _grads(
    state.params, graphdef, process, key, batch, accum_steps
  )
  loss = metrics['loss']
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


def jit_train_step(
  graphdef,
  process,
  tx,
  ema_decay,
  state_shardings,
  mesh,
  *,
  accum_steps: int = 1,
):
  """train_step under jit with explicit shardings and a donated state.

  Batches are dicts of batch-major arrays ('tokens', optional 'loss_mask'),
  each split over the mesh's data axes.
  """
  from ddlm_jax.parallel import batch_sharding, replicated

  step = functools.partial(
    train_step,
    graphdef=graphdef,
    process=process,
    tx=tx,
    ema_decay=ema_decay,
    accum_steps=accum_steps,
  )
  return jax.jit(
    step,
    in_shardings=(state_shardings, batch_sharding(mesh)),
    out_shardings=(state_shardings, replicated(mesh)),
    donate_argnums=(0,),
  )


def loss_fn(params, key, x_BxL, *, graphdef, process, loss_mask_BxL=None):
  """Scalar training loss (used by tests to compare gradients)."""
  return _loss_and_metrics(
    params, graphdef, process, key, x_BxL, loss_mask_BxL
  )[0]
