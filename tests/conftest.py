"""Pytest setup: 8 fake CPU devices, cheap compilation, a compilation cache.

XLA reads the device flag once, when the backend starts, so it must be set
before anything imports jax. The compilation cache lives in the checkout
(.jax_cache/, ignored by git), so a fresh clone starts empty and the tests
of one session (both xdist workers and the CLI subprocesses, which inherit
the environment) reuse each other's compiled smoke programs.
"""

import importlib.metadata
import os
import pathlib

import pytest

_CACHE = pathlib.Path(__file__).resolve().parents[1] / '.jax_cache' / 'tests'


def _jaxlib_minor() -> tuple[int, int]:
  """(major, minor) of the installed jaxlib, read without importing jax."""
  try:
    parts = importlib.metadata.version('jaxlib').split('.')
    return int(parts[0]), int(parts[1])
  except (importlib.metadata.PackageNotFoundError, ValueError, IndexError):
    return (0, 0)


# Tests run tiny programs: XLA's cheapest CPU optimisation level compiles
# them ~1.5x faster, and the numbers they check do not depend on it. On
# jaxlib 0.10 the legacy (non-MLIR) CPU fusion emitters compile the smoke
# train step ~2x faster (3.4 s -> 1.7 s); jaxlib 0.12 removed the flag, and
# XLA aborts on an unknown flag, so it is set only where it is known to exist.
_FLAGS = [
  '--xla_force_host_platform_device_count=8',
  '--xla_backend_optimization_level=0',
  '--xla_llvm_disable_expensive_passes=true',
]
if _jaxlib_minor() == (0, 10):
  _FLAGS.append('--xla_cpu_use_fusion_emitters=false')
os.environ.setdefault('XLA_FLAGS', ' '.join(_FLAGS))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', str(_CACHE))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.3')

# As experiments.run does: reuse freed host memory (imports jax, so after
# the flags above).
from ddlm_jax.parallel import keep_freed_memory  # noqa: E402

keep_freed_memory()


# Heaviest files first (longest-processing-time order, from the per-file
# times of an earlier full run). xdist's --dist loadfile hands whole files to
# idle workers in collection order, so a heavy file collected last would
# leave the other worker idle at the end of the run.
_HEAVY_FIRST = (
  'test_multiprocess.py',
  'test_ssm.py',
  'test_training.py',
  'test_planning_tasks.py',
  'test_state_tracking_train.py',
  'test_data_sources.py',
  'test_soft_masking.py',
  'test_families.py',
  'test_fit.py',
  'test_hybrid.py',
  'test_uniform_samplers.py',
  'test_planning.py',
  'test_kernels_scan.py',
  'test_state_tracking_options.py',
  'test_device_check.py',
  'test_kernels_attention.py',
  'test_kernels_export.py',
  'test_benchmarks.py',
  'test_colab.py',
  'test_uniform_diffusion.py',
  'test_colab_samplers.py',
  'test_sharding.py',
  'test_layers.py',
  'test_block_sampling.py',
)


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(_HEAVY_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope='session')
def smoke_mdlm_run(tmp_path_factory):
  """(workdir, summary) of one quickstart smoke run: 6 steps, no samples.

  Trained once per test worker and shared by every test that only reads a
  trained masked run (tests that change files copy it first), so the suite
  does not train the same smoke model once per file.
  """
  from ddlm_jax.tasks import language_model as lm
  from experiments.configs import quickstart

  config = quickstart.get_config('smoke')
  config.sample.num_samples = 0
  config.mesh.shape = (1, 1, 1)
  workdir = str(tmp_path_factory.mktemp('smoke_mdlm'))
  return workdir, lm.train_and_evaluate(config, workdir)


@pytest.fixture(scope='session')
def judge_results():
  """(claim id, [(seed, parsed JSON)]) -> (record, verdict) as
  ``experiments.reproduce`` makes them from its processes' results, with
  the claim's own reader and notes; ValueError when a result holds no
  value for the claim."""
  from experiments import claims as registry
  from experiments import reproduce
  from experiments.claims import records

  def judge(claim_id, results):
    claim = registry.CLAIMS[claim_id]
    m = claim.measurement
    record = records.start(
      claim_id,
      claim.command,
      budget='cpu',
      seeds=[seed for seed, _ in results],
      seed_kind=m.seed_kind,
    )
    record['arms'] = reproduce.measured_arms(m, results)
    record['notes'] = m.describe([r for _, r in results]) if m.describe else ''
    records.validate(record)
    return record, reproduce.verdict_of(claim, record)

  return judge
