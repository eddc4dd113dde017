"""Post-hoc look at a pdssm_groups run: accuracy per prefix length and P_t.

python -m experiments.pdssm_posthoc RUN_DIR
"""

from __future__ import annotations

import json
import pickle
import sys

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ddlm_jax.data import state_tracking as st
from ddlm_jax.models import sequence_classifier as sc
from ddlm_jax.tasks import state_tracking as st_task
from experiments import pdssm_groups as pg


def main(run):
  with open(f'{run}/summary.json') as f:
    s = json.load(f)
  # The run's flags, back from its summary (old and new drivers write them).
  argv = [
    f'--task={s["task"]}', f'--num_generators={s["k"]}',
    f'--model={s["model"]}', f'--preset={s["preset"]}', f'--N={s["N"]}',
    f'--layers={s["layers"]}', f'--seed={s["seed"]}', f'--out={run}',
    f'--magnitude_init={s.get("magnitude_init") or 0.0}',
  ]  # fmt: skip
  a = pg.parse(argv)
  c = pg.build_config(a)
  ccfg = st_task.classifier_config(c)
  model = sc.SequenceClassifier(ccfg, rngs=nnx.Rngs(0))
  with open(f'{run}/best_params.pkl', 'rb') as f:
    params = pickle.load(f)
  nnx.update(model, params)
  kw = dict(num_generators=a.num_generators or None)
  group = st.task_spec(a.task).group is not None
  data = st.make_split(
    a.task, 'validation', 128, seed=99, min_len=40, max_len=40,
    prefix_labels=group, **kw,
  )  # fmt: skip
  out = {}
  if group:
    logits = model.logits_all(
      jnp.asarray(data['tokens']), jnp.asarray(data['lengths'])
    )
    hit = np.asarray(jnp.argmax(logits, -1)) == data['prefix_labels']
    out['acc_by_prefix_length'] = [round(float(v), 3) for v in hit.mean(0)]
  val = st.make_split(
    a.task, 'validation', 64, seed=98, min_len=40, max_len=256, **kw
  )
  diag = pg.diagnose(model, ccfg.vocab_size, val)
  # The token permutations restricted to the orbit of e_0, with |D| there.
  tok = jnp.arange(1, ccfg.vocab_size)[None, :]
  mixer, u = pg.mixer_input(model.blocks[0], model.embed(tok))
  p = np.asarray(mixer.transition_indices(u))[0]
  d = np.asarray(mixer.diagonal(u))[0]
  orbit, frontier = {0}, [0]
  while frontier:
    frontier = [
      int(r[j]) for j in frontier for r in p if int(r[j]) not in orbit
    ]
    orbit.update(frontier)
  orb = sorted(orbit)
  out['orbit'] = orb
  out['token_maps_on_orbit'] = [[int(r[j]) for j in orb] for r in p]
  out['absD_on_orbit'] = [
    [round(float(abs(d[t, j])), 3) for j in orb] for t in range(len(p))
  ]
  out['phase_on_orbit_turns'] = [
    [round(float(np.angle(d[t, j]) / (2 * np.pi)) % 1, 3) for j in orb]
    for t in range(len(p))
  ]
  out['diag'] = diag
  print(json.dumps(out, indent=None))
  with open(f'{run}/posthoc.json', 'w') as f:
    json.dump(out, f, indent=1)


if __name__ == '__main__':
  main(sys.argv[1])
