"""Where run metrics go besides metrics.jsonl: TensorBoard, Weights & Biases.

`config.log.backends` names them, comma-separated: 'jsonl' (always on:
metrics.jsonl is the record of truth, and what plots and summaries read),
'tensorboard' (event files in workdir/tensorboard, written by tensorboardX,
`pip install -e ".[tensorboard]"`) and 'wandb' (`pip install -e
".[wandb]"`). W&B runs online only where it can: `log.wandb_mode='auto'`
logs online when an API key is configured and api.wandb.ai answers, and
offline otherwise (workdir/wandb; `wandb sync` uploads it later), so a
run on a machine without network never waits on it.

A backend whose package is missing is refused when the writers are made,
in one line naming the extra to install.
"""

from __future__ import annotations

import os
import socket

from ddlm_jax import paths
from ddlm_jax.training.config import ConfigError

BACKENDS = ('jsonl', 'tensorboard', 'wandb')
_EXTRA = {'tensorboard': 'tensorboardX', 'wandb': 'wandb'}
WANDB_MODES = ('auto', 'online', 'offline', 'disabled')


def parse_backends(spec) -> tuple[str, ...]:
  """'jsonl,tensorboard' -> ('jsonl', 'tensorboard'); unknown names refused.

  jsonl is always included (metrics.jsonl is the record every reader uses).
  """
  if isinstance(spec, str):
    names = [s.strip() for s in spec.split(',') if s.strip()]
  else:
    names = [str(s).strip() for s in (spec or ())]
  bad = [n for n in names if n not in BACKENDS]
  if bad:
    raise ConfigError(
      f'log.backends={spec!r}: unknown backend {bad[0]!r}; choose from '
      f'{", ".join(BACKENDS)} (comma-separated).'
    )
  return ('jsonl', *dict.fromkeys(n for n in names if n != 'jsonl'))


def check_backends(log_cfg) -> tuple[str, ...]:
  """The backends of a `log` block, each importable (else ConfigError)."""
  log_cfg = log_cfg or {}
  names = parse_backends(log_cfg.get('backends', 'jsonl'))
  mode = log_cfg.get('wandb_mode', 'auto')
  if mode not in WANDB_MODES:
    raise ConfigError(
      f'log.wandb_mode={mode!r}; choose one of {", ".join(WANDB_MODES)}.'
    )
  for name in names[1:]:
    module = _EXTRA[name]
    try:
      __import__(module)
    except ImportError:
      raise ConfigError(
        f'log.backends has {name!r} but {module} is not installed; '
        f'pip install -e ".[{name}]" or drop it from --config.log.backends.'
      ) from None
  return names


def _wandb_reachable(timeout: float = 2.0) -> bool:
  host = os.environ.get('WANDB_BASE_URL', 'https://api.wandb.ai')
  host = host.split('://')[-1].split('/')[0]
  name, _, port = host.partition(':')
  try:
    with socket.create_connection((name, int(port or 443)), timeout=timeout):
      return True
  except OSError:
    return False


def wandb_mode(requested: str = 'auto') -> str:
  """'online' or 'offline' for 'auto'; WANDB_MODE in the environment wins."""
  if os.environ.get('WANDB_MODE'):
    return os.environ['WANDB_MODE']
  if requested != 'auto':
    return requested
  has_key = bool(os.environ.get('WANDB_API_KEY'))
  if not has_key:
    netrc = os.path.expanduser('~/.netrc')
    if os.path.exists(netrc):
      with open(netrc) as f:
        has_key = 'api.wandb.ai' in f.read()
  return 'online' if has_key and _wandb_reachable() else 'offline'


class TensorBoardWriter:
  """Scalars as `split/name` under workdir/tensorboard (tensorboardX)."""

  def __init__(self, workdir: str):
    from tensorboardX import SummaryWriter

    self.logdir = os.path.join(workdir, 'tensorboard')
    self._writer = SummaryWriter(self.logdir)

  def write(self, step: int, split: str, scalars: dict[str, float]):
    for key, value in scalars.items():
      self._writer.add_scalar(f'{split}/{key}', value, step)
    self._writer.flush()

  def close(self):
    self._writer.close()


class WandbWriter:
  """One W&B run per workdir (resumed by id when the run resumes)."""

  def __init__(self, workdir: str, log_cfg, config: dict | None):
    import wandb

    mode = wandb_mode(log_cfg.get('wandb_mode', 'auto'))
    name = paths.absolute(workdir).rstrip('/').rsplit('/', 1)[-1]
    self.mode = mode
    self._run = wandb.init(
      project=log_cfg.get('wandb_project', '') or 'ddlm_jax',
      entity=log_cfg.get('wandb_entity', '') or None,
      name=name,
      # A stable id: a resumed run appends to the same W&B run.
      id=_run_id(workdir),
      resume='allow',
      # W&B keeps its files on a local disk: a URI workdir's go to ./wandb.
      dir=None if paths.is_remote(workdir) else workdir,
      mode=mode,
      config=config or {},
      reinit='create_new',
    )

  def write(self, step: int, split: str, scalars: dict[str, float]):
    self._run.log({f'{split}/{k}': v for k, v in scalars.items()}, step=step)

  def close(self):
    self._run.finish()


def _run_id(workdir: str) -> str:
  """An id kept in workdir/wandb_id, made on first use."""
  path = paths.join(workdir, 'wandb_id')
  if paths.exists(path):
    return paths.read_text(path).strip()
  import uuid

  run_id = uuid.uuid4().hex[:12]
  paths.write_text(path, run_id)
  return run_id


def make_writers(workdir: str, config: dict | None) -> list:
  """The extra writers a run's config asks for (jsonl is written apart)."""
  log_cfg = (config or {}).get('log') or {}
  names = check_backends(log_cfg)
  writers = []
  if 'tensorboard' in names:
    writers.append(TensorBoardWriter(workdir))
  if 'wandb' in names:
    writers.append(WandbWriter(workdir, log_cfg, config))
  return writers


__all__ = [
  'BACKENDS',
  'TensorBoardWriter',
  'WandbWriter',
  'check_backends',
  'make_writers',
  'parse_backends',
  'wandb_mode',
]
