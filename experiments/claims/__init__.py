"""Paper claims as code: every claim the suite checks, and its verdict.

One module per paper (or group of papers) lists its claims (``spec.Claim``);
``records/`` holds what was measured for each (``records``), and
``verdict`` turns the newest record into a verdict by the claim's rule.
``python -m experiments.reproduce CLAIM`` measures a claim again and
writes a record; ``python -m experiments.results_doc`` regenerates
docs/RESULTS.md from the registry and the records.
"""

from __future__ import annotations

from experiments.claims import (
  block,
  ddpd,
  dgemma,
  evaluation,
  mdlm,
  pdssm,
  pgm,
  planning,
  prime,
  project,
  samplers,
  soft_masking,
  uniform,
)
from experiments.claims.spec import Claim

# Order of the families in docs/RESULTS.md.
FAMILIES = (
  'quickstart',
  'bounds',
  'throughput',
  'kernels',
  'state tracking',
  'samplers',
  'soft-masking',
  'planning',
  'uniform',
  'block diffusion',
  'word level',
  'paper recipes',
  'interop',
  'accelerators',
)


def _collect() -> dict[str, Claim]:
  out: dict[str, Claim] = {}
  for module in (
    project,
    mdlm,
    pdssm,
    samplers,
    soft_masking,
    planning,
    uniform,
    block,
    prime,
    ddpd,
    dgemma,
    pgm,
    evaluation,
  ):
    for claim in module.CLAIMS:
      if claim.id in out:
        raise ValueError(f'claim id {claim.id} is registered twice')
      if claim.family not in FAMILIES:
        raise ValueError(f'claim {claim.id}: unknown family {claim.family}')
      out[claim.id] = claim
  return out


CLAIMS: dict[str, Claim] = _collect()


def get(claim_id: str) -> Claim:
  """The claim, or a KeyError that lists the closest ids."""
  if claim_id in CLAIMS:
    return CLAIMS[claim_id]
  import difflib

  close = difflib.get_close_matches(claim_id, list(CLAIMS), n=3)
  hint = f'; did you mean {", ".join(close)}?' if close else ''
  raise KeyError(
    f'no claim {claim_id!r}{hint} (python -m experiments.reproduce --list)'
  )
