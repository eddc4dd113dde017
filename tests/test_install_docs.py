"""README and LAUNCH install the same way: through the package's extras."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ('README.md', 'docs/LAUNCH.md')


def _pip_lines():
  for doc in DOCS:
    for line in (ROOT / doc).read_text().splitlines():
      if 'pip install' in line:
        yield doc, line


def test_jax_is_installed_only_through_the_extras():
  """A bare jax[tpu] can pull a jax outside the supported range."""
  for doc, line in _pip_lines():
    assert not re.search(r'pip install[^`]*\bjax\[', line), (doc, line)


def test_every_extra_the_docs_name_exists():
  extras = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project'][
    'optional-dependencies'
  ]
  named = set()
  for _, line in _pip_lines():
    for group in re.findall(r'-e "?\.\[([a-z0-9_,]+)\]', line):
      named.update(group.split(','))
  assert {'tpu', 'gpu', 'data', 'tensorboard', 'wandb'} <= named
  assert named <= set(extras), named - set(extras)
  assert 'datasets~=5.2' in extras['data']
