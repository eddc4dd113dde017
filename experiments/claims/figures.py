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
)
