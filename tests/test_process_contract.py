"""The family seam: the declared process contract, and a family from outside.

1. No library code probes a process with `hasattr` or a defaulted
   `getattr`: consumers type against `ddlm_jax.diffusion.base`.
2. A toy family defined in `tests/fixtures/toy_family.py` (its process and
   its config class, registered on import) has the closed-form bound its
   docstring derives, and trains, evaluates and samples through
   `experiments.run` with no library file knowing it.
"""

from __future__ import annotations

import ast
import json
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddlm_jax.diffusion import base
from ddlm_jax.sampling.common import process_family

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tests' / 'fixtures'))
import toy_family  # noqa: E402  (registers 'toy_absorbing')


def process_probes(source: str, filename: str = '<src>') -> list[str]:
  """'file:line call' for each hasattr(P, ...) or getattr(P, name, default)
  whose object P is spelled with 'process' (a process, by this project's
  naming convention)."""
  out = []
  for node in ast.walk(ast.parse(source, filename=filename)):
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
      continue
    name, args = node.func.id, node.args
    probing = (name == 'hasattr' and len(args) == 2) or (
      name == 'getattr' and len(args) == 3
    )
    if probing and 'process' in ast.unparse(args[0]).lower():
      out.append(f'{filename}:{node.lineno} {ast.unparse(node)}')
  return out


def test_no_library_code_probes_a_process():
  found = []
  for path in sorted((ROOT / 'ddlm_jax').rglob('*.py')):
    found += process_probes(path.read_text(), str(path.relative_to(ROOT)))
  assert not found, 'type against diffusion.base instead:\n' + '\n'.join(found)


def test_the_probe_scan_finds_planted_probes():
  src = (
    'def f(process, run):\n'
    "  a = hasattr(process, 'schedule')\n"
    "  b = getattr(run.process, 'causal', False)\n"
    "  c = getattr(process, 'family')\n"  # no default: not a probe
    "  d = hasattr(run, 'x')\n"
  )
  assert [p.split()[0] for p in process_probes(src)] == ['<src>:2', '<src>:3']


def test_toy_family_is_registered_and_declared():
  assert 'toy_absorbing' in base.registered_kinds()
  settings = base.process_config({'kind': 'toy_absorbing'})
  process = settings.build(5)
  assert isinstance(process, base.DiffusionProcess)
  assert process_family(process) == 'masked' and process.generate_id == 5
  with pytest.raises(ValueError, match='did you mean process.antithetic'):
    base.process_config({'kind': 'toy_absorbing', 'antithetc': False})
  with pytest.raises(ValueError, match="did you mean 'toy_absorbing'"):
    base.process_config({'kind': 'toy_absorbing_'})


def test_toy_bound_of_a_uniform_predictor_is_l_log_v():
  """E[NELBO] = L log V exactly for uniform logits (module docstring)."""
  vocab, length, batch, draws = 7, 16, 64, 32
  process = toy_family.ToyAbsorbing(vocab_size=vocab)
  x_BxL = jax.random.randint(jax.random.key(1), (batch, length), 0, vocab)
  uniform = lambda z, t: jnp.zeros(z.shape + (vocab,))

  @jax.jit
  def one(key):
    return process.loss(uniform, key, x_BxL)[1]

  values = np.concatenate(
    [np.asarray(one(k)) for k in jax.random.split(jax.random.key(2), draws)]
  )
  mean, se = values.mean(), values.std(ddof=1) / math.sqrt(values.size)
  assert abs(mean - length * math.log(vocab)) < 4 * se
  # A predictor that knows x pays nothing: the bound is a sum of CEs.
  exact = lambda z, t: 50.0 * jax.nn.one_hot(x_BxL, vocab)
  assert float(process.loss(exact, jax.random.key(3), x_BxL)[1].max()) < 1e-6


def _run(workdir, *args):
  cmd = [
    sys.executable,
    '-m',
    'experiments.run',
    '--config=tests/fixtures/toy_family.py:smoke',
    f'--workdir={workdir}',
    *args,
  ]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.slow
def test_toy_family_trains_evaluates_and_samples_through_the_cli(tmp_path):
  workdir = tmp_path / 'toy'
  _run(workdir)
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['process'] == {'kind': 'toy_absorbing', 'antithetic': True}
  records = [
    json.loads(line)
    for line in (workdir / 'metrics.jsonl').read_text().splitlines()
  ]
  assert any('loss' in r for r in records)
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['process'] == 'toy_absorbing'
  _run(workdir, '--mode=eval')
  _run(workdir, '--mode=sample')
  samples = list(workdir.glob('samples*.txt'))
  assert samples and samples[0].read_text().strip()
