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


FIGURES: tuple[Figure, ...] = ()
