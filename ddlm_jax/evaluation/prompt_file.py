"""`--mode=sample --prompt_file=PATH`: continue every prompt of a file.

A `.jsonl` file holds one JSON object per line with a "prompt" string (or
a bare JSON string per line), so prompts may span lines; any other file
holds one prompt per line (empty lines skipped). The run is loaded as the
Python API loads it (`ddlm_jax.load`), all prompts are continued in one
batch row by row (`Model.generate`), and the texts go to the next free
samples file of the workdir with their stats.
"""

from __future__ import annotations

import json
import os

from ddlm_jax.evaluation.sample_run import write_samples
from ddlm_jax.training.config import ConfigError


def read_prompts(path: str) -> list[str]:
  """The prompts of a text or JSONL file; ConfigError if it has none."""
  if not os.path.isfile(path):
    raise ConfigError(f'--prompt_file={path}: no such file.')
  with open(path, encoding='utf-8') as f:
    lines = f.read().splitlines()
  if not path.endswith('.jsonl'):
    prompts = [line for line in lines if line.strip()]
  else:
    prompts = []
    for n, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        item = json.loads(line)
      except json.JSONDecodeError as err:
        raise ConfigError(
          f'--prompt_file={path} line {n}: not JSON ({err.msg}); write one '
          'object {"prompt": "..."} per line.'
        ) from None
      text = item.get('prompt') if isinstance(item, dict) else item
      if not isinstance(text, str):
        raise ConfigError(
          f'--prompt_file={path} line {n}: no "prompt" string; write one '
          'object {"prompt": "..."} per line.'
        )
      prompts.append(text)
  if not prompts:
    raise ConfigError(f'--prompt_file={path} holds no prompt.')
  return prompts


def sample_prompt_file(
  config, workdir: str, path: str, *, max_new_tokens: int | None = None
) -> dict:
  """Continues each prompt of `path`; writes samples; returns the stats.

  Row b uses the seed config.sample.seed + b, so a prompt's text does not
  depend on the other prompts of the file.
  """
  from ddlm_jax import api

  prompts = read_prompts(path)
  model = api.load(workdir, config=config)
  texts = model.generate(
    prompts,
    seed=int(config.sample.get('seed', 0)),
    max_new_tokens=max_new_tokens,
  )
  stats = {
    **model.last_stats,
    'step': model.step,
    'prompt_file': os.path.abspath(path),
    'max_new_tokens': max_new_tokens,
  }
  write_samples(workdir, texts, stats, config.sample.get('name', ''))
  return stats
