"""The project's own targets: the quickstart, throughput, kernels, speed.

These are not paper claims; each names the target the project set itself
and, where one exists, the paper whose method sets the baseline (md4's
sampler loop).

The timing claims run their benchmark in three fresh processes, one after
another (``experiments.reproduce``, ``spec.Measurement``); the functions
below read each claim's number from one process's JSON result.
"""

import functools

from experiments.claims.spec import (
  NAMED_BASELINE,
  TARGET,
  Arm,
  Claim,
  Measurement,
)
from experiments.claims.verdict import Threshold

QUICKSTART = 'experiments/configs/quickstart.py'
_REPRO = 'python -m experiments.reproduce'


def mfu_percent(result: dict) -> float:
  """train_step's MFU of its one variant, in percent."""
  (variant,) = result['variants']
  return 100.0 * variant['mfu']


def cached_vs_md4(rows: list[dict], steps: int) -> float:
  """samplers: the cached sampler's speed-up over md4's loop at T."""
  (row,) = [
    r for r in rows if r['sampler'] == 'ancestral_cached' and r['T'] == steps
  ]
  return row['speedup_vs_md4_loop']


def associative_at_long(result: dict, min_length: int = 1024) -> float:
  """scan_bench: the smallest sequential / associative time ratio over
  the shapes with L >= min_length ("no slower" must hold at each)."""
  ratios = [
    r['sequential_over_associative']
    for r in result['linear']
    if r['L'] >= min_length
  ]
  if not ratios:
    raise ValueError(f'scan_bench timed no length >= {min_length}')
  return min(ratios)


def dense_over_pd(result: dict, width: int = 64) -> float:
  """scan_bench: dense-transition scan time / PD scan time at N."""
  (row,) = [r for r in result['pd'] if r['N'] == width]
  return row['dense_over_pd']


_SCANS = dict(
  module='pallas_kernels.benchmarks.scan_bench',
  args=('--no-kernel',),
  smoke_args=(
    '--lengths=1024', '--widths=16', '--no-kernel', '--repeats=1',
    '--batch=1', '--pd_widths=64',
  ),
)  # fmt: skip


# Three processes of the sampler benchmark, which the two claims share:
# 23-26 minutes each on the idle 2-core host, 74 in all (2026-12-06).
_SAMPLER_MINUTES = 75


def _samplers(steps: int) -> Measurement:
  """The sampler benchmark at T = 256 and 1024, read at `steps`."""
  return Measurement(
    'experiments.benchmarks.samplers',
    ('--steps=256,1024', '--repeats=5', '--fixed='),
    'cached',
    functools.partial(cached_vs_md4, steps=steps),
    result_flag='--out',
    smoke_args=(
      '--steps=256,1024', '--repeats=1', '--fixed=', '--length=16',
      '--batch=1', '--width=32', '--depth=1', '--heads=2',
    ),
  )  # fmt: skip


CLAIMS = (
  Claim(
    id='quickstart-bound',
    family='quickstart',
    paper='project target',
    arxiv='',
    table='README',
    statement=(
      'The default model (hybrid attention / PD-SSM, simple CE) reaches '
      '<= 3.25 bits/char on the held-out plays after 1000 steps.'
    ),
    paper_value='target <= 3.25 bits/char',
    metric='validation bound, bits/char',
    protocol=TARGET,
    rule=Threshold('quickstart', 3.25, '<='),
    arms=(Arm('quickstart', QUICKSTART),),
    command=f'{_REPRO} quickstart-bound',
    bound='full',
    cost_minutes=25,
  ),
  Claim(
    id='quickstart-time',
    family='quickstart',
    paper='project target',
    arxiv='',
    table='README',
    statement='The quickstart run takes <= 600 s on 2 CPU cores.',
    paper_value='target <= 600 s',
    metric="run wall seconds (summary.json's wall_seconds)",
    protocol=TARGET,
    rule=Threshold('quickstart', 600.0, '<='),
    arms=(Arm('quickstart', QUICKSTART),),
    metric_key='wall_seconds',
    command=f'{_REPRO} quickstart-time',
    cost_minutes=25,
  ),
  Claim(
    id='quickstart-transformer-target',
    family='quickstart',
    paper='project target',
    arxiv='',
    table='README (before the hybrid default)',
    statement=(
      'The transformer MDLM on the NELBO objective reaches <= 3.3 '
      'bits/char in 1000 steps.'
    ),
    paper_value='target <= 3.3 bits/char',
    metric='validation bound, bits/char',
    protocol=TARGET,
    rule=Threshold('mdlm', 3.3, '<='),
    arms=(Arm('mdlm', 'experiments/configs/mdlm_quickstart.py'),),
    command=f'{_REPRO} quickstart-transformer-target',
    bound='full',
    cost_minutes=30,
  ),
  Claim(
    id='train-step-mfu',
    family='throughput',
    paper='project target',
    arxiv='',
    table='README',
    statement=(
      'The train step at the reference config (width 256, md4 adaLN) '
      'reaches >= 60% of the float32 matmul peak measured in the same run.'
    ),
    paper_value='target >= 60% MFU',
    metric='MFU, % of the float32 matmul peak',
    protocol=TARGET,
    rule=Threshold('step', 60.0, '>='),
    measurement=Measurement(
      'experiments.benchmarks.train_step',
      ('--time_conditioning', '--mlp_dim=704', '--repeats=10'),
      'step',
      mfu_percent,
      smoke_args=('--tiny', '--repeats=1', '--warmup=0', '--peak_n=256'),
    ),
    command=f'{_REPRO} train-step-mfu',
    cost_minutes=5,
  ),
  Claim(
    id='sampler-speed-vs-md4-256',
    family='samplers',
    paper="MD4's sampler loop as baseline",
    arxiv='2406.04329',
    table='md4 sampling.py (the baseline, not a paper number)',
    statement=(
      "The cached jitted ancestral sampler reaches >= 2x md4's jitted "
      'loop tokens/s at T = 256, L = 256, batch 4.'
    ),
    paper_value='target >= 2x the baseline',
    metric="speed-up over md4's loop (x)",
    protocol=NAMED_BASELINE,
    rule=Threshold('cached', 2.0, '>='),
    measurement=_samplers(256),
    command=f'{_REPRO} sampler-speed-vs-md4-256',
    cost_minutes=_SAMPLER_MINUTES,
  ),
  Claim(
    id='sampler-speed-vs-md4-1024',
    family='samplers',
    paper="MD4's sampler loop as baseline",
    arxiv='2406.04329',
    table='md4 sampling.py (the baseline, not a paper number)',
    statement=(
      "The cached sampler reaches >= 3.5x md4's loop tokens/s at T = 1024."
    ),
    paper_value='target >= 3.5x the baseline',
    metric="speed-up over md4's loop (x)",
    protocol=NAMED_BASELINE,
    rule=Threshold('cached', 3.5, '>='),
    measurement=_samplers(1024),
    command=f'{_REPRO} sampler-speed-vs-md4-1024',
    cost_minutes=_SAMPLER_MINUTES,
  ),
  Claim(
    id='scan-associative-vs-sequential',
    family='kernels',
    paper='project target',
    arxiv='',
    table='kernels',
    statement=(
      'On CPU the XLA associative diagonal scan is no slower than the '
      'sequential one at L >= 1024.'
    ),
    paper_value='target: sequential / associative time >= 1',
    metric='sequential time / associative time',
    protocol=TARGET,
    rule=Threshold('assoc', 1.0, '>='),
    measurement=Measurement(arm='assoc', value=associative_at_long, **_SCANS),
    command=f'{_REPRO} scan-associative-vs-sequential',
    cost_minutes=5,
  ),
  Claim(
    id='pd-scan-vs-dense',
    family='kernels',
    paper='PD-SSM',
    arxiv='2509.22284',
    table='parallel scan cost',
    statement=(
      'The PD scan is >= 20x faster than a dense-transition scan at '
      'N = 64, L = 1024.'
    ),
    paper_value='O(N) vs O(N^3) parallel combine; target >= 20x',
    metric='dense time / PD time (x)',
    protocol=TARGET,
    rule=Threshold('pd', 20.0, '>='),
    measurement=Measurement(arm='pd', value=dense_over_pd, **_SCANS),
    command=f'{_REPRO} pd-scan-vs-dense',
    cost_minutes=5,
  ),
  Claim(
    id='gpu-train-step-mfu',
    family='accelerators',
    paper='project target',
    arxiv='',
    table='device check',
    statement='A GPT-2-small MDLM train step reaches >= 45% MFU in bf16.',
    paper_value='target >= 45% MFU',
    metric='MFU %',
    protocol=TARGET,
    rule=Threshold('step', 45.0, '>='),
    command='python -m experiments.benchmarks.device_check --out=DIR',
    accelerator=True,
    cost_minutes=6,
  ),
  Claim(
    id='gpu-block-sparse-attention',
    family='accelerators',
    paper='project target',
    arxiv='',
    table='device check',
    statement=(
      "Block-sparse attention is >= 1.5x XLA's dense masked attention at "
      'L >= 4096 on a GPU.'
    ),
    paper_value='target >= 1.5x',
    metric='dense time / block-sparse time (x)',
    protocol=TARGET,
    rule=Threshold('kernel', 1.5, '>='),
    command='python -m experiments.benchmarks.device_check --out=DIR',
    accelerator=True,
    cost_minutes=6,
  ),
  Claim(
    id='gpu-auto-never-slower',
    family='accelerators',
    paper='project target',
    arxiv='',
    table='device check',
    statement="impl='auto' is never slower than 'xla' on a GPU.",
    paper_value='target: xla time / auto time >= 1',
    metric='xla time / auto time, worst case',
    protocol=TARGET,
    rule=Threshold('auto', 1.0, '>='),
    command='python -m experiments.benchmarks.device_check --out=DIR',
    accelerator=True,
    cost_minutes=6,
  ),
)
