"""Per-seed results a benchmark saves and reads back instead of measuring
again: OUT/sSEED/result.json, reused only when every field it was
measured with (the run, the settings) is the same, so seeds can be
measured as their runs finish and the records written once all are in."""

from __future__ import annotations

import json
import os


def path(out: str, seed: int) -> str:
  return os.path.join(out, f's{seed}', 'result.json')


def load_matching(file: str, **fields) -> dict | None:
  """The saved result if it exists and holds every field as given."""
  if not os.path.exists(file):
    return None
  with open(file) as f:
    old = json.load(f)
  if any(old.get(k) != v for k, v in fields.items()):
    return None
  print(f'reusing {file}', flush=True)
  return old


def save(file: str, result: dict) -> None:
  os.makedirs(os.path.dirname(file), exist_ok=True)
  with open(file, 'w') as f:
    json.dump(result, f, indent=1)
