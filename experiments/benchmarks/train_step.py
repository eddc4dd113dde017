"""Train-step throughput: step, forward and backward times, MFU and memory.

  python -m experiments.benchmarks.train_step [--width=256 --depth=4 ...]
  python -m experiments.benchmarks.train_step --time_conditioning \
    --compare='--dtype=float32;--dtype=bfloat16' --repeats=20

Three compiled programs per variant, timed in the same rounds: the loss
alone (forward), jax.value_and_grad of the loss (forward + backward, no
optimiser) and the full donated train step (with the AdamW update); the
backward is (fwd+bwd) - fwd and the optimiser (AdamW and the step's
finiteness guard) step - (fwd+bwd), in time and in FLOPs (XLA's cost
analysis of each compiled program). MFU is the step's FLOPs per second
over a dense float32 matmul peak timed in the same run (and over the
bfloat16 peak for bfloat16 variants). `--compare=A;B` builds both
variants (each a set of flag overrides) in one process and times them in
alternating rounds ABAB..., so load from other processes on a shared host
favours neither; it reports each variant's medians and B's speed-up over A.
`--profile=DIR` writes a jax.profiler trace of a few calls of each program
and, beside each, ops.md: its time per source line (op_profile.py).
DDLM_JAX_HOST_MALLOC=default in the environment times glibc's own
large-block handling (a fresh mmap per call, which page-faults the step's
temporaries in at every step) instead of the reuse that the suite's entry
points set (ddlm_jax.parallel.host_memory); it is a process setting, so
compare the two in alternating processes.

`build_train_step` and `time_calls` are also the train-step section of
device_check.py, which must import without grain, ml_collections or tfds:
keep this module's imports to jax, numpy and those ddlm_jax modules.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import pathlib
import resource
import shlex
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax.diffusion import MaskedDiffusion, get_schedule
from ddlm_jax.models import Transformer, TransformerConfig
from ddlm_jax.parallel import keep_freed_memory, make_mesh
from ddlm_jax.training.optimizer import make_optimizer
from ddlm_jax.training.state import count_params, init_train_state
from ddlm_jax.training.steps import jit_train_step, loss_fn
from experiments.benchmarks import op_profile

# --tiny: every size small enough for a CPU test in seconds.
TINY = dict(
  width=32,
  depth=1,
  heads=2,
  length=16,
  batch=2,
  vocab=8,
  repeats=2,
  warmup=1,
  peak_n=128,
)
# Flags that configure the run, not a variant: --compare may not change them.
RUN_FLAGS = ('compare', 'repeats', 'warmup', 'peak_n', 'json', 'profile')


# ------------------------------------------------------ shared set-up ------


@dataclasses.dataclass
class TrainStepBench:
  """A compiled, donated train step and the state it threads (mutable)."""

  graphdef: object
  process: object
  state: object
  compiled: Callable
  batch: dict
  compile_s: float

  def step(self) -> jax.Array:
    """One optimiser step; returns the loss (not yet synchronised)."""
    self.state, metrics = self.compiled(self.state, self.batch)
    return metrics['loss']

  @property
  def params(self) -> int:
    return count_params(self.state.params)


def masked_process(vocab: int) -> MaskedDiffusion:
  return MaskedDiffusion(get_schedule('loglinear'), vocab, t_min=1e-3)


def build_train_step(
  cfg: TransformerConfig,
  process,
  *,
  batch: int,
  length: int,
  learning_rate: float = 1e-3,
  seed: int = 0,
) -> TrainStepBench:
  """Initialises an AdamW state and compiles the LM train step for it.

  The batch is uniform random tokens of shape [batch, length]; compile_s
  includes the initialisation.
  """
  tx, _ = make_optimizer(
    learning_rate=learning_rate, warmup_steps=10, total_steps=1000
  )
  mesh = make_mesh((1, 1, 1))
  t0 = time.perf_counter()
  graphdef, state, shardings = init_train_state(
    lambda rngs: Transformer(cfg, rngs=rngs),
    tx,
    seed=seed,
    mesh=mesh,
    use_ema=False,
  )
  step = jit_train_step(graphdef, process, tx, 0.0, shardings, mesh)
  x_BxL = jax.random.randint(
    jax.random.key(seed), (batch, length), 0, cfg.vocab_size
  )
  tokens = {'tokens': x_BxL}
  compiled = step.lower(state, tokens).compile()
  return TrainStepBench(
    graphdef=graphdef,
    process=process,
    state=state,
    compiled=compiled,
    batch=tokens,
    compile_s=time.perf_counter() - t0,
  )


def time_calls(
  fn: Callable, *, max_n: int, min_n: int = 1, more: Callable = lambda: True
) -> tuple[list[float], object]:
  """Seconds of each synchronised call of fn(): min_n calls, then more ones
  while more() holds, up to max_n; also returns the last output."""
  times, out = [], None
  while len(times) < max_n and (len(times) < min_n or more()):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return times, out


def flops(compiled) -> float:
  """FLOPs of a compiled program from XLA's cost analysis."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost['flops'])


def matmul_peak(n: int, repeats: int, dtype=jnp.float32) -> float:
  """FLOP/s of an n x n x n matmul of `dtype` (best of max(repeats, 3))."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a, b: a @ b)
  jax.block_until_ready(f(a, b))
  times, _ = time_calls(lambda: f(a, b), max_n=max(repeats, 3))
  return 2.0 * n**3 / min(times)


# --------------------------------------------------------- one variant -----


def model_config(args) -> TransformerConfig:
  return TransformerConfig(
    vocab_size=args.vocab,
    input_vocab_size=args.vocab + 1,
    width=args.width,
    depth=args.depth,
    num_heads=args.heads,
    mlp_kind=args.mlp,
    mlp_dim=args.mlp_dim,
    time_conditioning=args.time_conditioning,
    cond_dim=args.cond_dim,
    attention_impl=args.attention_impl,
    dtype=args.dtype,
  )


class Variant:
  """The three compiled programs of one configuration, timed in rounds."""

  def __init__(self, label: str, args):
    self.label, self.args = label, args
    cfg = model_config(args)
    self.cfg = cfg
    self.bench = build_train_step(
      cfg, masked_process(args.vocab), batch=args.batch, length=args.length
    )
    graphdef, process = self.bench.graphdef, self.bench.process
    x_BxL = self.bench.batch['tokens']

    def loss(params, key, x_BxL):
      return loss_fn(params, key, x_BxL, graphdef=graphdef, process=process)

    params = self.bench.state.params
    self.key = jax.random.key(1)
    t0 = time.perf_counter()
    self.fwd = jax.jit(loss).lower(params, self.key, x_BxL).compile()
    self.fwd_bwd = (
      jax.jit(jax.value_and_grad(loss)).lower(params, self.key, x_BxL).compile()
    )
    self.compile_s = self.bench.compile_s + time.perf_counter() - t0
    self.x_BxL = x_BxL
    self.calls = {
      'step': self.bench.step,
      'forward': lambda: self.fwd(self.bench.state.params, self.key, x_BxL),
      'forward_backward': lambda: self.fwd_bwd(
        self.bench.state.params, self.key, x_BxL
      ),
    }
    # The compiled program behind each call (FLOPs, memory, profile).
    self.programs = {
      'step': self.bench.compiled,
      'forward': self.fwd,
      'forward_backward': self.fwd_bwd,
    }
    self.times = {name: [] for name in self.calls}
    self.losses = []

  def warm(self, n: int):
    for fn in self.calls.values():
      for _ in range(n):
        jax.block_until_ready(fn())

  def one_round(self):
    for name, fn in self.calls.items():
      times, out = time_calls(fn, max_n=1)
      self.times[name] += times
      if name == 'step':
        self.losses.append(float(out))

  def row(self, peak_f32: float, peak_bf16: float | None) -> dict:
    med = {k: float(np.median(v)) for k, v in self.times.items()}
    fl = {name: flops(c) for name, c in self.programs.items()}
    mem = self.bench.compiled.memory_analysis()
    mem_fb = self.fwd_bwd.memory_analysis()
    tokens = self.args.batch * self.args.length
    step_s = med['step']
    row = {
      'variant': self.label,
      'config': {
        k: v for k, v in vars(self.args).items() if k not in RUN_FLAGS
      },
      'hidden_dim': self.cfg.hidden_dim,
      'params': self.bench.params,
      'compile_s': self.compile_s,
      'step_seconds': step_s,
      'forward_seconds': med['forward'],
      'forward_backward_seconds': med['forward_backward'],
      'backward_seconds': med['forward_backward'] - med['forward'],
      'optimizer_seconds': step_s - med['forward_backward'],
      'tokens_per_sec': tokens / step_s,
      'step_gflops': fl['step'] / 1e9,
      'forward_gflops': fl['forward'] / 1e9,
      'forward_backward_gflops': fl['forward_backward'] / 1e9,
      'backward_gflops': (fl['forward_backward'] - fl['forward']) / 1e9,
      'optimizer_gflops': (fl['step'] - fl['forward_backward']) / 1e9,
      'achieved_gflops_per_sec': fl['step'] / step_s / 1e9,
      'mfu': fl['step'] / step_s / peak_f32,
      'step_over_forward_time': step_s / med['forward'],
      'backward_over_forward_time': (med['forward_backward'] - med['forward'])
      / med['forward'],
      'compiled_temp_mib': getattr(mem, 'temp_size_in_bytes', 0) / 2**20,
      'compiled_argument_mib': getattr(mem, 'argument_size_in_bytes', 0)
      / 2**20,
      'forward_backward_temp_mib': getattr(mem_fb, 'temp_size_in_bytes', 0)
      / 2**20,
      'final_loss': self.losses[-1] if self.losses else float('nan'),
      'seconds_per_round': {k: list(v) for k, v in self.times.items()},
    }
    if peak_bf16 and self.args.dtype == 'bfloat16':
      row['mfu_vs_bf16_peak'] = fl['step'] / step_s / peak_bf16
    return row


# ------------------------------------------------------------- the run -----


def variant_args(parser, base, overrides: str):
  """base with the flags in `overrides` (a shell-quoted string) applied."""
  args = parser.parse_args(shlex.split(overrides), copy.copy(base))
  changed = [
    k for k in RUN_FLAGS + ('tiny',) if getattr(args, k) != getattr(base, k)
  ]
  if changed:
    raise ValueError(
      f'--compare variant {overrides!r} sets {changed}; a variant may only '
      'change the model or batch flags, set run flags outside --compare.'
    )
  return args


def run(args, parser=None) -> dict:
  """Builds every variant, times them in alternating rounds, reports."""
  parser = parser or make_parser()
  if args.repeats < 1 or args.warmup < 0:
    raise ValueError('--repeats must be >= 1 and --warmup >= 0.')
  if args.compare:
    specs = [s.strip() for s in args.compare.split(';')]
    if len(specs) < 2:
      raise ValueError(
        f'--compare={args.compare!r} names one variant; give two sets of '
        "overrides separated by ';', e.g. '--dtype=float32;--dtype=bfloat16'."
      )
  else:
    specs = ['']
  arg_sets = [variant_args(parser, args, s) for s in specs]
  for a in arg_sets:  # Bad configurations raise before any compile.
    model_config(a)
  load_start = os.getloadavg()
  variants = [Variant(s or 'base', a) for s, a in zip(specs, arg_sets)]
  for v in variants:
    v.warm(args.warmup)
  for _ in range(args.repeats):  # ABAB...: each round times every variant.
    for v in variants:
      v.one_round()
  peak = matmul_peak(args.peak_n, args.repeats)
  peak_bf16 = None
  if any(a.dtype == 'bfloat16' for a in arg_sets):
    peak_bf16 = matmul_peak(args.peak_n, args.repeats, jnp.bfloat16)
  if args.profile:
    profile(variants, args.profile)
  rows = [v.row(peak, peak_bf16) for v in variants]
  first = rows[0]
  for r in rows:
    r['speedup_vs_first'] = {
      k: first[f'{k}_seconds'] / r[f'{k}_seconds']
      for k in ('step', 'forward', 'forward_backward')
    }
  result = {
    'config': vars(args),
    'variants': rows,
    'matmul_peak_gflops_per_sec': peak / 1e9,
    'process_peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    / 1024,
    'load_average_start_end': [load_start[0], os.getloadavg()[0]],
    'backend': jax.default_backend(),
    'devices': str(jax.devices()[0]),
    'jax': jax.__version__,
  }
  if peak_bf16:
    result['matmul_peak_bf16_gflops_per_sec'] = peak_bf16 / 1e9
  if len(rows) == 2:
    result['ratio'] = rows[1]['speedup_vs_first']
  return result


def profile(variants, log_dir: str, calls: int = 3) -> None:
  """A jax.profiler trace of `calls` calls of every program of each
  variant, one trace per program under log_dir/<variant>/<program>/, with
  the time per source line beside it in ops.md (op_profile.py)."""
  for i, v in enumerate(variants):
    for name, fn in v.calls.items():
      out = pathlib.Path(log_dir) / f'variant{i}' / name
      with jax.profiler.trace(str(out), create_perfetto_trace=True):
        for c in range(calls):
          with jax.profiler.TraceAnnotation(f'{v.label}:{name}:{c}'):
            jax.block_until_ready(fn())
      rows = op_profile.op_table(
        op_profile.op_seconds(out, calls), v.programs[name].as_text()
      )
      (out / 'ops.md').write_text(
        f'{v.label}: {name}\n\n{op_profile.markdown(rows)}\n'
      )


def table(result: dict) -> str:
  """Markdown rows: one per variant."""
  head = (
    '| variant | step s | fwd s | bwd s | opt s | bwd/fwd | MFU | tok/s '
    '| temp MiB | speed-up |\n|---|---|---|---|---|---|---|---|---|---|'
  )
  lines = [head]
  for r in result['variants']:
    lines.append(
      f'| {r["variant"]} | {r["step_seconds"]:.4g} | '
      f'{r["forward_seconds"]:.4g} | {r["backward_seconds"]:.4g} | '
      f'{r["optimizer_seconds"]:.4g} | '
      f'{r["backward_over_forward_time"]:.2f} | {100 * r["mfu"]:.1f}% | '
      f'{r["tokens_per_sec"]:.0f} | {r["compiled_temp_mib"]:.0f} | '
      f'{r["speedup_vs_first"]["step"]:.3f}x |'
    )
  return '\n'.join(lines)


def make_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument('--width', type=int, default=256)
  p.add_argument('--depth', type=int, default=4)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--length', type=int, default=256)
  p.add_argument('--batch', type=int, default=16)
  p.add_argument('--vocab', type=int, default=128)
  p.add_argument('--mlp', default='swiglu', help='mlp_kind')
  p.add_argument(
    '--mlp_dim',
    type=int,
    default=0,
    help='MLP hidden size; 0 = the default (704 for SwiGLU at width 256)',
  )
  p.add_argument(
    '--time_conditioning',
    action=argparse.BooleanOptionalAction,
    default=False,
    help='adaLN conditioning on t (md4 reference); --no-time_conditioning',
  )
  p.add_argument('--cond_dim', type=int, default=128, help='adaLN input')
  p.add_argument('--attention_impl', default='xla')
  p.add_argument('--dtype', default='float32', help='compute dtype')
  p.add_argument('--repeats', type=int, default=10, help='timed rounds')
  p.add_argument('--warmup', type=int, default=3)
  p.add_argument('--peak_n', '--peak-n', dest='peak_n', type=int, default=2048)
  p.add_argument(
    '--compare',
    default='',
    help="'A;B': two sets of flag overrides timed in alternating rounds",
  )
  p.add_argument('--profile', default='', help='write a jax.profiler trace')
  p.add_argument('--tiny', action='store_true', help=f'preset: {TINY}')
  p.add_argument('--json', default='', help='also write the result here')
  return p


def main(argv=None) -> dict:
  keep_freed_memory()
  p = make_parser()
  args = p.parse_args(argv)
  if args.tiny:  # Preset defaults; flags given explicitly still win.
    p.set_defaults(**TINY)
    args = p.parse_args(argv)
  result = run(args, p)
  print(json.dumps(result, indent=2))
  print(table(result))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == '__main__':
  main()
