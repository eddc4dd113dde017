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


def decay_mask(params):
  """Weight decay on matrices only (not norms, biases or scalars)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


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
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(
    learning_rate, warmup_steps, total_steps, final_lr_fraction
  )
  parts = []
  if grad_clip and grad_clip > 0:
    parts.append(optax.clip_by_global_norm(grad_clip))
  parts.append(
    optax.adamw(
      schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=decay_mask
    )
  )
  return optax.chain(*parts), schedule
