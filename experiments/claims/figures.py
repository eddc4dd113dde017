"""Figures docs/RESULTS.md shows beside the claims.

A figure is evidence that is not one claim's number: a whole curve, such as
the speed-quality frontier of every sampler. Each names the command that
draws it, the runs it read and when and where it was drawn, as a record
does; the image lives under docs/images/ (tests/test_claims.py checks that
it exists).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Figure:
  path: str  # Under docs/images/, relative to the repository.
  title: str
  caption: str
  command: str
  drawn: str  # Date, commit and host.
  table: str = ''  # A markdown table written by the same command, shown too.


_HOST = 'AMD EPYC, 2 cores shared with other jobs (load 4-12), jax 0.10.2'
_CAPTION = (
  'Every registered sampler that applies to a masked run, each over its '
  'own knob (steps, gamma, threshold, refresh period; two values each), '
  "at temperatures {temps}: the AR twin's gen-NLL interpolated at the "
  "validation text's unigram entropy (left; the table below "
  "gives each point's remaining entropy gap: the llada sampler stays "
  'far below it), the entropy at T = 1 (middle) and tokens/s (right, '
  'under load) against tokens per network call. 8 samples per point, '
  'one training seed. {note}'
)

FIGURES: tuple[Figure, ...] = (
  Figure(
    path='docs/images/frontier_char.png',
    title='Speed-quality frontier, character quickstart (L = 128)',
    caption=_CAPTION.format(
      temps='1.0 and 1.2',
      note='The model: mdlm_quickstart.py (the transformer on the NELBO), '
      'scored by ar_quickstart.py.',
    ),
    command=(
      'python -m experiments.frontier '
      '--config=experiments/configs/mdlm_quickstart.py '
      '--workdir=runs/mdlm_quickstart --scorer=runs/ar_quickstart '
      '--points=2 --temperatures=1.0,1.2 --num_samples=8'
    ),
    drawn=f'2026-12-05, commit 9e65b5c, {_HOST}',
    table='docs/images/frontier_char.md',
  ),
  Figure(
    path='docs/images/frontier_bpe.png',
    title='Speed-quality frontier, BPE quickstart (L = 128)',
    caption=_CAPTION.format(
      temps='0.9 and 1.0',
      note='The model: quickstart_bpe.py:long seed 0 (trained on 512-token '
      'windows, sampled at 128), scored by ar_quickstart_bpe.py:long. No '
      'position of this model reaches confidence 0.5, so the threshold '
      'sampler reveals one token per call here too.',
    ),
    command=(
      'python -m experiments.frontier '
      '--config=experiments/configs/quickstart_bpe.py:long '
      '--config.data.seq_len=128 --workdir=runs/quickstart_bpe_long_s0 '
      '--scorer=runs/quickstart_bpe_long_ar --points=2 '
      '--temperatures=0.9,1.0 --num_samples=8'
    ),
    drawn=f'2026-12-05, commit 9e65b5c, {_HOST}',
    table='docs/images/frontier_bpe.md',
  ),
  Figure(
    path='docs/images/pdssm_groups_curves.png',
    title='PD-SSM group claims: learning curves and group diagnostics',
    caption=(
      'One row per claim, one line per training seed of its newest record '
      '(the groups preset, four restarts side by side; the curves follow '
      'the restart validation keeps). Left: validation accuracy on words '
      "of lengths 40-256 (solid) and the best restart's accuracy on the "
      'training batch (dashed). Middle: the fraction of token maps that '
      'are bijections on the states reachable from e_0. Right: '
      "faithful_relations, the fraction of the group's relations the "
      'hardened maps satisfy on their best closed block, 0 unless that '
      'block tells every element apart. S3 and A4 runs reach 100% with a '
      'faithful permutation representation, except A4 seed 2, which '
      'reaches 100% at test without one: the diagnostic certifies a '
      'permutation representation, it does not explain every solution. '
      "A5 (8 generators, N = 60, 1% of the authors' sequences) fits the "
      'training words (dashed) while validation stays at 3-38% and its '
      'hardened maps are almost never bijections (at most 2 of 8 at any '
      'evaluation, none at the tested parameters).'
    ),
    command='python -m experiments.group_curves',
    drawn=f'2026-12-05, commit 62025b6, {_HOST}',
  ),
)
