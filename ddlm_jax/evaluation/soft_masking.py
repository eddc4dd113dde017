"""How far a trained soft-masking layer opens, by masking level.

`lambda_profile(run)` draws z_t at fixed times t on validation batches, runs
pass 1 (the plain network) and reads lambda from its logits exactly as pass
2 would: the mean over masked positions says how much feedback the trained
SM layer lets through at each masking level.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

PROFILE_TIMES = (0.1, 0.3, 0.5, 0.7, 0.9)


def lambda_profile(
  run, times=PROFILE_TIMES, *, num_batches: int = 8, batch_size: int = 32
) -> dict:
  """{'by_t': {t: {'mean_lambda', 'max_lambda'}}, 'w_s', 'w_a', 'w_b'}.

  Args:
    run: a restored soft-masked run (ddlm_jax.tasks.language_model.load_run).
  """
  process, graphdef = run.process, run.graphdef
  params = run.eval_params()

  @jax.jit
  def stats(params, key, x_BxL, t):
    model = nnx.merge(graphdef, params)
    t_B = jnp.full((x_BxL.shape[0],), t)
    z_BxL = process.corrupt(key, x_BxL, t_B)
    lam_BxL = model.feedback_lambda(model(z_BxL, t_B))
    masked = (z_BxL == process.mask_id).astype(jnp.float32)
    return jnp.sum(lam_BxL * masked), jnp.sum(masked), jnp.max(lam_BxL)

  batches = run.data.eval_batches(
    'validation',
    seq_len=run.settings.data.seq_len,
    batch_size=batch_size,
    max_batches=num_batches,
  )
  out = {}
  for t in times:
    num = den = peak = 0.0
    for i, b in enumerate(batches):
      n, d, m = stats(params, jax.random.key(i), jnp.asarray(b['tokens']), t)
      num, den, peak = num + float(n), den + float(d), max(peak, float(m))
    out[str(t)] = {'mean_lambda': num / max(den, 1.0), 'max_lambda': peak}
  scalars = nnx.merge(graphdef, params).soft_mask.scalars()
  w_s, w_a, w_b = (float(v) for v in scalars)
  return {'by_t': out, 'w_s': w_s, 'w_a': w_a, 'w_b': w_b}
