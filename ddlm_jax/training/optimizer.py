"""AdamW with linear warmup, cosine decay and global-norm clipping."""

from __future__ import annotations

import jax
import optax


def learning_rate_schedule(
  peak: float, warmup_steps: int, total_steps: int, final_fraction=0.1
) -> optax.Schedule:
  """Linear warmup to `peak`, then cosine decay to final_fraction * peak."""
  warmup_steps = max(0, min(warmup_steps, total_steps))
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=peak,
    warmup_steps=warmup_steps,
    decay_steps=max(total_steps, warmup_steps + 1),
    end_value=peak * final_fraction,
  )


def decay_mask(params, replica_axis: bool = False):
  """Weight decay on matrices only (not norms, biases or scalars).

  replica_axis: every leaf carries a leading axis of independent replicas,
  which does not count towards a leaf's rank.
  """
  rank = 3 if replica_axis else 2
  return jax.tree.map(lambda p: p.ndim >= rank, params)


def per_replica(tx: optax.GradientTransformation):
  """A stateless transformation (clipping) applied to each replica alone.

  Every leaf's leading axis indexes independent replicas trained side by
  side (restarts), so a global-norm clip sees each replica's own norm, as
  it would in a run of its own.
  """

  def update(updates, state, params=None):
    del params
    return jax.vmap(lambda u: tx.update(u, state)[0])(updates), state

  return optax.GradientTransformation(tx.init, update)


def make_optimizer(
  *,
  learning_rate: float,
  warmup_steps: int,
  total_steps: int,
  weight_decay: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.999,
  grad_clip: float = 1.0,
  final_lr_fraction: float = 0.1,
  group_learning_rates: dict[str, float] | None = None,
  replica_axis: bool = False,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW (+ clipping); returns (transformation, main schedule).

  replica_axis: the parameters stack independent replicas on a leading
  axis; each is clipped and decayed as if trained alone (Adam's moments
  are per entry already).

  group_learning_rates {name: peak}: parameters under a top-level key
  `name` (e.g. 'soft_mask', whose scalars train at 1e-2 while the model
  trains at 3e-4) get their own peak on the same warmup/decay shape.
  Gradients are clipped jointly, before the groups split.
  """
  schedule = learning_rate_schedule(
    learning_rate, warmup_steps, total_steps, final_lr_fraction
  )
  mask = lambda params: decay_mask(params, replica_axis)
  adamw = lambda lr: optax.adamw(
    lr, b1=b1, b2=b2, weight_decay=weight_decay, mask=mask
  )
  parts = []
  if grad_clip and grad_clip > 0:
    clip = optax.clip_by_global_norm(grad_clip)
    parts.append(per_replica(clip) if replica_axis else clip)
  if group_learning_rates:
    transforms = {'default': adamw(schedule)}
    for name, peak in group_learning_rates.items():
      transforms[name] = adamw(
        learning_rate_schedule(
          peak, warmup_steps, total_steps, final_lr_fraction
        )
      )
    parts.append(
      optax.multi_transform(
        transforms, lambda params: group_labels(params, group_learning_rates)
      )
    )
  else:
    parts.append(adamw(schedule))
  return optax.chain(*parts), schedule


def group_labels(params, groups) -> dict:
  """'default' or the group name for each leaf, by its top-level key."""
  if not isinstance(params, dict):
    raise TypeError('parameter groups need a dict of parameters.')
  missing = set(groups) - set(params)
  if missing:
    raise ValueError(
      f'learning-rate groups {sorted(missing)} name no parameters; the '
      f'model has {sorted(params)}.'
    )
  return {
    k: jax.tree.map(lambda _, k=k: k if k in groups else 'default', v)
    for k, v in params.items()
  }


def optimizer_from_config(optimizer, total_steps: int):
  """make_optimizer with the fields of a typed OptimizerConfig."""
  return make_optimizer(
    learning_rate=optimizer.learning_rate,
    warmup_steps=optimizer.warmup_steps,
    total_steps=total_steps,
    weight_decay=optimizer.weight_decay,
    b1=optimizer.b1,
    b2=optimizer.b2,
    grad_clip=optimizer.grad_clip,
    final_lr_fraction=optimizer.final_lr_fraction,
    group_learning_rates=dict(optimizer.group_learning_rates) or None,
    replica_axis=optimizer.replica_axis,
  )
