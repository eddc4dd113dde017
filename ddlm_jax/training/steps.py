"""The pure train step: (state, batch) -> (state, metrics), for any task.

A task supplies loss(params, key, batch) -> (loss, metrics); for language
models the process (masked diffusion, AR, ...) supplies it through
`lm_loss`, with the model merged from its graph definition and the
parameter dict inside the step, so one step serves every process and
backbone.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ddlm_jax.diffusion.base import Process
from ddlm_jax.parallel import batch_sharding, replicated
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


def _loss_and_metrics(
  params, graphdef, process, key, x_BxL, loss_mask_BxL, step=None
):
  """Per-token loss: sums over sequences divided by the real tokens.

  `step` is the global training step (None outside training); every
  process takes it, and those that declare `uses_step` (Duo's curriculum)
  read it.
  """
  objective_B, nelbo_B, aux = process.loss(
    make_apply(graphdef, params), key, x_BxL, loss_mask_BxL, step=step
  )
  tokens = _num_tokens(x_BxL, loss_mask_BxL)
  loss = objective_B.sum() / tokens
  metrics = {'loss': loss, 'nelbo_per_token': nelbo_B.sum() / tokens}
  for name, value in aux.items():
    metrics[name] = jnp.mean(value)
  return loss, metrics


def lm_loss(graphdef, process: Process):
  """loss(params, key, batch) -> (per-token loss, metrics) for a process."""

  def loss(params, key, batch):
    step_B = batch.get('step')
    return _loss_and_metrics(
      params,
      graphdef,
      process,
      key,
      batch['tokens'],
      batch.get('loss_mask'),
      step=None if step_B is None else step_B[0],
    )

  return loss


def lm_weight(batch) -> jax.Array:
  """A batch's real tokens: its weight among accumulated micro-batches."""
  return _num_tokens(batch['tokens'], batch.get('loss_mask'))


def batch_size_weight(batch) -> jax.Array:
  """Every sequence counts once (losses averaged over sequences)."""
  return jnp.float32(jax.tree.leaves(batch)[0].shape[0])


def accumulate_grads(loss, params, key, batch, accum_steps: int, weight):
  """(loss, metrics, grads) of `loss`, over `accum_steps` micro-batches.

  Micro-batches run in a lax.scan so the activations of one micro-batch at
  a time are live. Each micro-batch's loss is a mean over its own tokens,
  so losses, metrics and gradients are combined with weights weight(mb)
  (its real tokens): the result equals the loss of the whole batch even
  when padding leaves micro-batches with different token counts.
  """
  grad_fn = jax.value_and_grad(loss, has_aux=True)
  if accum_steps == 1:
    (value, metrics), grads = grad_fn(params, key, batch)
    return value, metrics, grads
  batch_size = jax.tree.leaves(batch)[0].shape[0]
  if batch_size % accum_steps:
    raise ValueError(
      f'batch of {batch_size} does not split into {accum_steps} '
      'micro-batches; change optim.grad_accum_steps or the batch size.'
    )
  # Micro-batch i is rows i, i + k, i + 2k, ... (k = accum_steps): each
  # device's contiguous shard of a data-parallel batch then splits evenly
  # into the k micro-batches, and the scan runs over an unsharded axis.
  # (Contiguous micro-batches would put the scanned axis on the devices:
  # every micro-step would then run the whole local batch, with k times
  # the compute and no activation saving.)
  micro = jax.tree.map(
    lambda a: a.reshape(
      batch_size // accum_steps, accum_steps, *a.shape[1:]
    ).swapaxes(0, 1),
    batch,
  )

  def body(carry, inputs):
    i, mb = inputs
    (value, metrics), grads = grad_fn(params, jax.random.fold_in(key, i), mb)
    w = weight(mb)
    scaled = jax.tree.map(lambda v: w * v, (value, metrics, grads))
    total = jax.tree.map(jnp.add, carry[0], scaled)
    return (total, carry[1] + w), None

  first = jax.tree.map(lambda a: a[0], micro)
  shapes = jax.eval_shape(lambda: grad_fn(params, key, first))
  (value0, metrics0), grads0 = shapes
  zeros = jax.tree.map(
    lambda s: jnp.zeros(
      s.shape, jnp.float32 if s.dtype == jnp.int32 else s.dtype
    ),
    (value0, metrics0, grads0),
  )
  (total, weight_sum), _ = jax.lax.scan(
    body, (zeros, jnp.float32(0.0)), (jnp.arange(accum_steps), micro)
  )
  value, metrics, grads = jax.tree.map(lambda v: v / weight_sum, total)
  return value, metrics, grads


def _grads(params, graphdef, process, key, batch, accum_steps: int):
  """(metrics, grads) of the LM loss (kept for the gradient tests)."""
  _, metrics, grads = accumulate_grads(
    lm_loss(graphdef, process), params, key, batch, accum_steps, lm_weight
  )
  return metrics, grads


def _tree_all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def train_step(
  state: TrainState,
  batch: dict,
  *,
  loss,
  tx: optax.GradientTransformation,
  ema_decay: float,
  accum_steps: int = 1,
  weight=batch_size_weight,
  uses_step: bool = False,
):
  """One optimiser step of loss(params, key, batch) -> (loss, metrics).

  A non-finite loss, gradient or updated parameter freezes the state (no
  update from that step on) and records the step in state.bad_step, so
  nothing non-finite can ever be saved. `uses_step` gives the loss the
  global step as batch['step'] (a process's declared `uses_step`).
  """
  rng, key = jax.random.split(state.rng)
  if uses_step:
    # Per sequence, so that micro-batching splits it like any batch leaf.
    size = jax.tree.leaves(batch)[0].shape[0]
    batch = {**batch, 'step': jnp.full((size,), state.step, jnp.int32)}
  value, metrics, grads = accumulate_grads(
    loss, state.params, key, batch, accum_steps, weight
  )
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ema = state.ema_params
  if ema is not None:
    ema = jax.tree.map(
      lambda e, p: ema_decay * e + (1.0 - ema_decay) * p, ema, params
    )
  finite = (
    jnp.isfinite(value) & _tree_all_finite(grads) & _tree_all_finite(params)
  )
  healthy = finite & (state.bad_step < 0)
  keep = lambda new, old: jax.tree.map(
    lambda n, o: jnp.where(healthy, n, o), new, old
  )
  new_state = state.replace(
    step=state.step + healthy.astype(jnp.int32),
    params=keep(params, state.params),
    opt_state=keep(opt_state, state.opt_state),
    ema_params=None if ema is None else keep(ema, state.ema_params),
    rng=rng,
    bad_step=jnp.where(
      (state.bad_step < 0) & ~finite, state.step + 1, state.bad_step
    ),
  )
  metrics = {'loss': value, **metrics}
  metrics['grad_norm'] = optax.global_norm(grads)
  return new_state, metrics


def jit_step(
  loss,
  tx,
  ema_decay,
  state_shardings,
  mesh,
  *,
  accum_steps: int = 1,
  weight=batch_size_weight,
  uses_step: bool = False,
  compiler_options=None,
):
  """train_step under jit with explicit shardings and a donated state.

  Batches are dicts of batch-major arrays, each split over the mesh's
  data axes.
  """
  step = functools.partial(
    train_step,
    loss=loss,
    tx=tx,
    ema_decay=ema_decay,
    accum_steps=accum_steps,
    weight=weight,
    uses_step=uses_step,
  )
  return jax.jit(
    step,
    in_shardings=(state_shardings, batch_sharding(mesh)),
    out_shardings=(state_shardings, replicated(mesh)),
    donate_argnums=(0,),
    compiler_options=compiler_options,
  )


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
  """The LM step of a process (per-token weighted micro-batches)."""
  return jit_step(
    lm_loss(graphdef, process),
    tx,
    ema_decay,
    state_shardings,
    mesh,
    accum_steps=accum_steps,
    weight=lm_weight,
    uses_step=process.uses_step,
  )


def loss_fn(params, key, x_BxL, *, graphdef, process, loss_mask_BxL=None):
  """Scalar training loss (used by tests to compare gradients)."""
  return _loss_and_metrics(
    params, graphdef, process, key, x_BxL, loss_mask_BxL
  )[0]
