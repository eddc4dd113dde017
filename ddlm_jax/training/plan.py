"""Plans a run before it is launched: compiled memory, FLOPs and time.

Nothing is allocated: the model, optimizer and train state are built with
`jax.eval_shape`, and the train step, an eval step (the NELBO of a batch)
and one sampler call (one network call on a sampling batch) are lowered
and compiled for the configured mesh, usually on fake CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``). XLA's compiled
cost analysis gives the FLOPs of each program per device and its memory
analysis the bytes each device holds (arguments, outputs, temporaries);
the train step is compiled with and without rematerialisation. Beside
them: parameters by module, the closed-form FLOPs of
`ddlm_jax.evaluation.cost.transformer_flops` (3x the forward for a step),
the largest per-device tensor of the compiled step, checkpoint size, tokens
per step, and the step and run time on named accelerators at their nominal
dense bf16 peak and an assumed MFU.

The memory is what XLA:CPU's buffer assignment needs for the same
per-device program. Accelerator compilers schedule and fuse better: on an
H200 the same GPT-2-sized MDLM step compiled to 0.43x the CPU's peak
(and XLA:CPU gains little from remat, which cut the GPU's peak 4x;
docs/LAUNCH.md section 7), so a CPU plan is an upper bound: "fits" is
safe, "does not fit" names the switches that would shrink the program
and should be checked on the device (device_check.py --plan).

Entry points: `plan_lm` (a built model, process and optimizer; used by the
device check, no ml_collections) and `plan_task` (any `fit.Task`, from its
first batch). `ddlm_jax.tasks.plans` plans a config of each kind with them
(``python -m experiments.run --config=... --mode=plan [--devices=N]``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ddlm_jax import paths
from ddlm_jax.evaluation import cost
from ddlm_jax.parallel import batch_sharding, replicated
from ddlm_jax.training import steps
from ddlm_jax.training.state import (
  abstract_state,
  fresh_state,
  module_init,
  param_shardings,
  split_model,
  train_state_shardings,
)


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """A named chip: dense bf16 peak (FLOP/s) and memory (bytes)."""

  name: str
  peak_bf16: float
  memory: float


# Nominal dense (no sparsity) bf16 peaks and memory per chip, from the
# vendors' data sheets.
ACCELERATORS = (
  Accelerator('v4', 275e12, 32 * 2**30),
  Accelerator('v5e', 197e12, 16 * 2**30),
  Accelerator('v5p', 459e12, 95 * 2**30),
  Accelerator('H100', 989e12, 80e9),
  Accelerator('H200', 989e12, 141e9),
)
# Assumed model-FLOP utilisation of the time estimates: what a well-tuned
# dense transformer step of this size reaches; the device check measures
# the real one.
ASSUMED_MFU = 0.4
# A plan fits a chip when its peak is under this share of the chip's
# memory (the runtime, the compiler's own choices and fragmentation take
# the rest).
HEADROOM = 0.85
# Plans of more devices than this are refused: compiling for the fake
# devices of a 1000-chip pod takes long and says nothing a smaller
# slice with the same per-device batch would not.
MAX_DEVICES = 512

_DTYPE_BYTES = {
  'pred': 1,
  's8': 1,
  'u8': 1,
  's16': 2,
  'u16': 2,
  'bf16': 2,
  'f16': 2,
  's32': 4,
  'u32': 4,
  'f32': 4,
  's64': 8,
  'u64': 8,
  'f64': 8,
  'c64': 8,
}
_SHAPE_RE = re.compile(r'\b(' + '|'.join(_DTYPE_BYTES) + r')\[([\d,]*)\]')


# ------------------------------------------------------------ pure parts ---


def largest_tensor(hlo_text: str) -> dict:
  """The largest array shape written in an HLO module's text (per device
  for a partitioned program): {'shape', 'bytes'}."""
  best = {'shape': '', 'bytes': 0}
  for dtype, dims in _SHAPE_RE.findall(hlo_text):
    size = _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(',') if d)
    if size > best['bytes']:
      best = {'shape': f'{dtype}[{dims}]', 'bytes': size}
  return best


def params_by_module(params) -> dict[str, int]:
  """Parameter counts grouped by path with layer indices dropped
  ('blocks/attn/...' sums every layer's attention)."""
  counts: dict[str, int] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = [str(getattr(p, 'key', getattr(p, 'idx', p))) for p in path]
    names = [n for n in names if not n.isdigit()][:2]
    key = '/'.join(names[:-1] or names)
    counts[key] = counts.get(key, 0) + int(math.prod(leaf.shape))
  return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def tree_bytes(tree, shardings=None) -> int:
  """Bytes of a pytree of arrays or ShapeDtypeStructs; per device when
  `shardings` (a matching tree of NamedShardings) is given."""
  leaves = jax.tree.leaves(tree)
  shards = (
    jax.tree.leaves(shardings)
    if shardings is not None
    else [None] * len(leaves)
  )
  total = 0
  for leaf, sharding in zip(leaves, shards):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      continue
    shape = sharding.shard_shape(leaf.shape) if sharding else leaf.shape
    total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
  return total


def memory_of(compiled) -> dict:
  """Bytes per device of a compiled program (XLA's memory analysis).

  peak = arguments + outputs - aliased (donated) + temporaries.
  """
  m = compiled.memory_analysis()
  get = lambda name: int(getattr(m, f'{name}_size_in_bytes', 0) or 0)
  out = {k: get(k) for k in ('argument', 'output', 'alias', 'temp')}
  out['peak'] = out['argument'] + out['output'] - out['alias'] + out['temp']
  return out


def flops_of(compiled) -> float:
  """FLOPs per device of a compiled program (XLA's cost analysis)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0]
  return float(analysis['flops'])


def time_estimates(
  step_flops: float, chips: int, num_steps: int, mfu: float = ASSUMED_MFU
) -> dict[str, dict]:
  """Step seconds and run days per accelerator for a step of
  `step_flops` (all devices together) on `chips` chips at `mfu`."""
  out = {}
  for acc in ACCELERATORS:
    step_s = step_flops / (chips * acc.peak_bf16 * mfu)
    out[acc.name] = {
      'step_seconds': step_s,
      'run_days': step_s * num_steps / 86_400,
    }
  return out


def verdicts(peak: int, peak_remat: int | None, state: int, fix: dict):
  """fits / does not fit per accelerator, with the switches that would
  make a plan that does not fit fit (estimates, see `switches`)."""
  out = {}
  for acc in ACCELERATORS:
    budget = HEADROOM * acc.memory
    row = {'fits': peak <= budget, 'memory_gib': acc.memory / 2**30}
    if not row['fits']:
      row['switches'] = switches(peak, peak_remat, state, budget, fix)
    out[acc.name] = row
  return out


def switches(peak, peak_remat, state, budget, fix: dict) -> list[str]:
  """What would bring a per-device `peak` under `budget`.

  `state` is the train state's bytes per device (parameters, Adam moments,
  EMA); the rest of the peak is activations and temporaries, which
  gradient accumulation over k micro-batches divides by about k, and
  rematerialisation shrinks to `peak_remat`'s. More fsdp ways divide the
  state. `fix` holds the current values: remat, grad_accum_steps, fsdp,
  data (the data-parallel ways that fsdp could take over) and batch (the
  global batch, which every micro-batch must still split over data x
  fsdp; 0 = unchecked).
  """
  out = []
  rest = max(peak - state, 0)
  if not fix.get('remat') and peak_remat is not None:
    if peak_remat <= budget:
      return ['--config.model.remat=True']
    out.append('--config.model.remat=True')
    rest = max(peak_remat - state, 0)
  accum = int(fix.get('grad_accum_steps', 1))
  ways = int(fix.get('data', 1)) * int(fix.get('fsdp', 1))
  # Micro-batches must still split over the data-parallel devices.
  rows = int(fix.get('batch', 0)) // max(ways, 1)
  most = 1  # The most micro-batches that still split.
  for k in (2, 4, 8, 16, 32):
    if rows and rows % (accum * k):
      break
    most = k
    if state + rest / k <= budget:
      return [*out, f'--config.optim.grad_accum_steps={accum * k}']
  fsdp = int(fix.get('fsdp', 1))
  accum_flag = []
  if most > 1:
    accum_flag = [f'--config.optim.grad_accum_steps={accum * most}']
  f = 2
  while fsdp * f <= ways:
    if state / f + rest / most <= budget:
      mesh = f'--config.mesh.shape="({ways // (fsdp * f)},{fsdp * f},1)"'
      return [*out, mesh, *accum_flag]
    f *= 2
  return [*out, 'more chips (the train state alone does not fit)']


# ------------------------------------------------------------ the planner --


@dataclasses.dataclass
class LMSpec:
  """What plan_lm compiles: a language-model run, built abstractly.

  `build(remat)` returns the nnx builder of the network with block
  rematerialisation on or off; `model_config` the TransformerConfig of
  the closed-form FLOPs (None for other backbones).
  """

  build: Callable[[bool], Callable]
  process: object
  tx: object
  mesh: object
  batch_size: int
  seq_len: int
  num_steps: int
  remat: bool = False
  ema_decay: float = 0.0
  accum_steps: int = 1
  loss_mask: bool = False
  eval_batch_size: int = 0
  sample_batch_size: int = 0
  model_config: object = None
  paper_params: int = 0
  label: str = ''
  settings: dict = dataclasses.field(default_factory=dict)


def network_length(spec: LMSpec) -> int:
  """Tokens per row the network reads: 2L for block diffusion (it reads
  concat(z_t, x)), else L."""
  from ddlm_jax.diffusion.base import BlockProcess

  doubled = isinstance(spec.process, BlockProcess)
  return 2 * spec.seq_len if doubled else spec.seq_len


def abstract_train(build, tx, mesh, ema: bool):
  """(graphdef, abstract TrainState with shardings, shardings) of an nnx
  builder, its parameters sharded by their logical axes."""
  graphdef, abstract_params = split_model(build)
  state, shardings = abstract_state_of(
    module_init(build), tx, mesh, ema, param_shardings(abstract_params, mesh)
  )
  return graphdef, state, shardings


def abstract_state_of(init, tx, mesh, ema: bool, p_shard=None, extra=None):
  """(abstract TrainState with shardings, shardings): init_state's state,
  shapes only. `p_shard` defaults to replicated parameters."""

  def make(rng):
    return fresh_state(init, tx, rng, use_ema=ema, init_extra=extra)

  shapes = jax.eval_shape(make, jax.random.key(0))
  if p_shard is None:
    p_shard = jax.tree.map(lambda _: replicated(mesh), shapes.params)
  shardings = train_state_shardings(shapes, p_shard, mesh)
  return abstract_state(shapes, shardings), shardings


def _batch(mesh, size: int, length: int, loss_mask: bool) -> dict:
  shard = batch_sharding(mesh)
  batch = {
    'tokens': jax.ShapeDtypeStruct((size, length), jnp.int32, sharding=shard)
  }
  if loss_mask:
    batch['loss_mask'] = jax.ShapeDtypeStruct(
      (size, length), jnp.float32, sharding=shard
    )
  return batch


def compile_train_step(spec: LMSpec, remat: bool):
  """(compiled step, abstract state, shardings) of the spec's train step."""
  graphdef, state, shardings = abstract_train(
    spec.build(remat), spec.tx, spec.mesh, spec.ema_decay > 0
  )
  step = steps.jit_train_step(
    graphdef,
    spec.process,
    spec.tx,
    spec.ema_decay,
    shardings,
    spec.mesh,
    accum_steps=spec.accum_steps,
  )
  batch = _batch(spec.mesh, spec.batch_size, spec.seq_len, spec.loss_mask)
  return step.lower(state, batch).compile(), state, shardings, graphdef


def compile_eval_step(spec: LMSpec, graphdef, state, shardings):
  """The NELBO of one eval batch (one t draw), as evaluation computes it."""
  process = spec.process.evaluation_process
  loss = steps.lm_loss(graphdef, process)

  def evaluate(params, batch):
    return loss(params, jax.random.key(0), batch)[1]['nelbo_per_token']

  batch = _batch(spec.mesh, spec.eval_batch_size, spec.seq_len, spec.loss_mask)
  fn = jax.jit(
    evaluate,
    in_shardings=(shardings.params, batch_sharding(spec.mesh)),
    out_shardings=replicated(spec.mesh),
  )
  return fn.lower(state.params, batch).compile()


def compile_sampler_call(spec: LMSpec, graphdef, state, shardings):
  """One network call on a sampling batch: the cost of a sampler step."""

  def call(params, z_BxL, t_B):
    return steps.make_apply(graphdef, params)(z_BxL, t_B)

  shard = batch_sharding(spec.mesh)
  size = spec.sample_batch_size
  z = jax.ShapeDtypeStruct((size, spec.seq_len), jnp.int32, sharding=shard)
  t = jax.ShapeDtypeStruct((size,), jnp.float32, sharding=shard)
  fn = jax.jit(call, in_shardings=(shardings.params, shard, shard))
  return fn.lower(state.params, z, t).compile()


def _devices_of(mesh) -> int:
  return int(math.prod(mesh.shape.values()))


def plan_lm(spec: LMSpec, *, sections=('train', 'remat', 'eval', 'sample')):
  """The plan of an LM run (a JSON-ready dict); see the module docstring.

  `sections` picks the programs compiled besides the configured train
  step: 'remat' (the step with remat flipped), 'eval', 'sample'.
  """
  t0 = time.perf_counter()
  mesh = spec.mesh
  devices = _devices_of(mesh)
  step, state, shardings, graphdef = compile_train_step(spec, spec.remat)
  compile_s = {'train': time.perf_counter() - t0}
  tokens = spec.batch_size * spec.seq_len
  result = step_report(
    step,
    state,
    shardings,
    mesh,
    tokens=tokens,
    batch_size=spec.batch_size,
    accum_steps=spec.accum_steps,
  )
  mem = memory_of(step)
  result['memory_per_device']['remat'] = spec.remat
  result.update(
    label=spec.label,
    settings=dict(spec.settings),
    paper_params=spec.paper_params or None,
  )
  if spec.model_config is not None:
    closed = 3 * cost.transformer_flops(
      spec.model_config, spec.batch_size, network_length(spec)
    )
    result['flops']['closed_form_train_step'] = closed
    result['flops']['closed_form_per_token'] = closed / tokens
  peak_remat = None
  if 'remat' in sections:
    t1 = time.perf_counter()
    name = 'peak_with_remat' if not spec.remat else 'peak_without_remat'
    try:
      other = compile_train_step(spec, not spec.remat)[0]
    except Exception as err:  # noqa: BLE001 - a finding of the plan.
      # The switch itself does not trace for this process (recorded, so
      # the verdict does not suggest it).
      result['memory_per_device'][name] = None
      result[f'{name}_error'] = f'{type(err).__name__}: {err}'[:500]
    else:
      flipped = memory_of(other)['peak']
      result['memory_per_device'][name] = flipped
      result['flops']['train_step_flipped_remat'] = (
        flops_of(other) * devices * spec.accum_steps
      )
      peak_remat = flipped if not spec.remat else mem['peak']
    compile_s['train_remat_flipped'] = time.perf_counter() - t1
  if 'eval' in sections and spec.eval_batch_size:
    t1 = time.perf_counter()
    ev = compile_eval_step(spec, graphdef, state, shardings)
    compile_s['eval'] = time.perf_counter() - t1
    result['eval_step'] = {
      'batch': spec.eval_batch_size,
      'flops': flops_of(ev) * devices,
      'peak_per_device': memory_of(ev)['peak'],
    }
  if 'sample' in sections and spec.sample_batch_size:
    t1 = time.perf_counter()
    sc = compile_sampler_call(spec, graphdef, state, shardings)
    compile_s['sample'] = time.perf_counter() - t1
    result['sampler_call'] = {
      'batch': spec.sample_batch_size,
      'flops': flops_of(sc) * devices,
      'peak_per_device': memory_of(sc)['peak'],
    }
  finish(result, spec.num_steps, peak_remat, spec.remat, spec.accum_steps)
  result['compile_seconds'] = compile_s
  return result


def step_report(
  step, state, shardings, mesh, *, tokens, batch_size, accum_steps=1
) -> dict:
  """What a compiled train step and its abstract state say per device:
  parameters (by module), FLOPs, memory, largest tensor, checkpoint size.

  XLA's cost analysis counts a loop body once, so with gradient
  accumulation (a scan over micro-batches) the step's FLOPs are the
  count times accum_steps (the optimizer update, outside the loop and
  well under 1% of a step, is counted that many times too).
  """
  devices = _devices_of(mesh)
  data_ways = mesh.shape['data'] * mesh.shape['fsdp']
  mem = memory_of(step)
  params = state.params
  state_dev = {
    'params': tree_bytes(params, shardings.params),
    'optimizer': tree_bytes(state.opt_state, shardings.opt_state),
    'ema': tree_bytes(state.ema_params, shardings.ema_params)
    if state.ema_params is not None
    else 0,
    'extra': tree_bytes(state.extra, shardings.extra)
    if state.extra is not None
    else 0,
  }
  flops_dev = flops_of(step) * accum_steps
  return {
    'label': '',
    'devices': devices,
    'mesh': dict(mesh.shape),
    'platform': mesh.devices.flat[0].platform,
    'params': int(sum(math.prod(x.shape) for x in jax.tree.leaves(params))),
    'params_by_module': params_by_module(params),
    'tokens_per_step': tokens,
    'batch_per_device': batch_size // data_ways,
    'flops': {
      'train_step_per_device': flops_dev,
      'train_step': flops_dev * devices,
      'per_token': flops_dev * devices / max(tokens, 1),
    },
    'memory_per_device': {
      **{f'state_{k}': v for k, v in state_dev.items()},
      'arguments': mem['argument'],
      'outputs': mem['output'],
      'aliased': mem['alias'],
      'activations_and_temporaries': mem['temp'],
      'peak': mem['peak'],
      'remat': False,
    },
    'largest_tensor_per_device': largest_tensor(step.as_text()),
    'checkpoint_bytes': tree_bytes(
      (state.params, state.opt_state, state.ema_params, state.extra)
    ),
  }


def finish(result: dict, num_steps, peak_remat, remat: bool, accum: int):
  """Adds the time estimates and the fits verdicts to a step_report."""
  mem = result['memory_per_device']
  state = sum(v for k, v in mem.items() if k.startswith('state_'))
  result['estimates'] = {
    'assumed_mfu': ASSUMED_MFU,
    'num_steps': num_steps,
    'per_accelerator': time_estimates(
      result['flops']['train_step'], result['devices'], num_steps
    ),
  }
  fix = {
    'remat': remat,
    'grad_accum_steps': accum,
    'data': result['mesh']['data'],
    'fsdp': result['mesh']['fsdp'],
    'batch': result['batch_per_device']
    * result['mesh']['data']
    * result['mesh']['fsdp'],
  }
  result['fits'] = verdicts(mem['peak'], peak_remat, state, fix)
  result['headroom'] = HEADROOM
  return result


def plan_task(
  task, trainer_config, mesh, label: str = '', tokens_per_step: int = 0
) -> dict:
  """The plan of any loop task (`ddlm_jax.training.fit.Task`): its train
  step compiled on `mesh` for the shapes of its first batch (read from the
  task's own stream, which for the synthetic tasks costs nothing).
  `tokens_per_step` (0: batch x length of the first array) sets tokens/s."""
  from ddlm_jax.training.optimizer import optimizer_from_config

  tx, _ = optimizer_from_config(
    trainer_config.optimizer, trainer_config.num_steps
  )
  p_shard = None
  if task.param_shardings is not None:
    p_shard = task.param_shardings(mesh)
  state, shardings = abstract_state_of(
    task.init,
    tx,
    mesh,
    trainer_config.ema_decay > 0,
    p_shard,
    task.init_extra,
  )
  first = next(iter(task.batches(0)))
  shard = batch_sharding(mesh)
  batch = {
    k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype, sharding=shard)
    for k, v in first.items()
  }
  t0 = time.perf_counter()
  step = steps.jit_step(
    task.loss,
    tx,
    trainer_config.ema_decay,
    shardings,
    mesh,
    accum_steps=trainer_config.grad_accum_steps,
    weight=task.weight,
    uses_step=task.uses_step,
  )
  compiled = step.lower(state, batch).compile()
  leading = next(iter(batch.values())).shape
  tokens = tokens_per_step or int(math.prod(leading[:2]))
  result = step_report(
    compiled,
    state,
    shardings,
    mesh,
    tokens=tokens,
    batch_size=leading[0],
    accum_steps=trainer_config.grad_accum_steps,
  )
  result['label'] = label
  finish(
    result,
    trainer_config.num_steps,
    None,
    False,
    trainer_config.grad_accum_steps,
  )
  result['compile_seconds'] = {'train': time.perf_counter() - t0}
  return result


# ---------------------------------------------------- from an LM config ---

# Vocabulary sizes of the tokenizers the paper configs name, so a plan
# needs no tokenizer files (the HF tokenizers' own sizes, added tokens
# included).
KNOWN_VOCABS = {'gpt2': 50257, 'bert-base-uncased': 30522}


def vocab_size_of(data) -> int:
  """The tokenizer's vocabulary size typed data settings (a
  `ddlm_jax.data.settings.DataConfig`) will have, without data.

  Known for text8 (27 characters), the HF tokenizers of KNOWN_VOCABS,
  bytes (256) and BPE (data.bpe_vocab_size); a test tokenizer has
  data.test_tokenizer_vocab ids. Anything else is refused (a character
  tokenizer's size depends on the corpus).
  """
  from ddlm_jax.training.config import ConfigError

  corpus = data.corpus
  hf = data.hf_tokenizer
  if corpus == 'text8':
    from ddlm_jax.data.tokenizers import TEXT8_ALPHABET

    return len(TEXT8_ALPHABET)
  if corpus in ('lm1b', 'openwebtext'):
    hf = hf or ('bert-base-uncased' if corpus == 'lm1b' else 'gpt2')
    if hf.startswith('test:'):
      return int(data.test_tokenizer_vocab)
    if hf in KNOWN_VOCABS:
      return KNOWN_VOCABS[hf]
  elif data.tokenizer == 'byte':
    return 256
  elif data.tokenizer == 'bpe':
    return int(data.bpe_vocab_size)
  raise ConfigError(
    f'--mode=plan cannot tell the vocabulary of corpus={corpus!r} '
    f'(tokenizer {hf or data.tokenizer!r}) without its data; plan '
    f'a config with a tokenizer of known size ({sorted(KNOWN_VOCABS)}, '
    'text8, byte or bpe).'
  )


# ------------------------------------------------------------ reporting ---


def _gib(n) -> str:
  """Bytes in GiB (MiB below one GiB), with the unit."""
  if n >= 2**30:
    return f'{n / 2**30:.2f} GiB'
  return f'{n / 2**20:.1f} MiB'


def table(plan: Mapping) -> str:
  """A short text table of a plan (one per role of a pipeline's plan)."""
  if 'roles' in plan:
    return '\n\n'.join(
      f'role {role}:\n{table(p)}' for role, p in plan['roles'].items()
    )
  mem = plan['memory_per_device']
  fl = plan['flops']
  lines = [
    f'plan: {plan.get("label") or "run"} on {plan["devices"]} '
    f'{plan["platform"]} devices, mesh {plan["mesh"]}',
    f'params            {plan["params"] / 1e6:.1f}M'
    + (
      f' (paper: {plan["paper_params"] / 1e6:.0f}M)'
      if plan.get('paper_params')
      else ''
    ),
    f'tokens per step   {plan["tokens_per_step"]:,}',
    f'FLOPs per step    {fl["train_step"]:.3g} compiled'
    + (
      f', {fl["closed_form_train_step"]:.3g} closed form'
      if 'closed_form_train_step' in fl
      else ''
    ),
    f'FLOPs per token   {fl["per_token"]:.3g}',
    f'memory per device {_gib(mem["peak"])} peak (remat '
    f'{"on" if mem["remat"] else "off"}): state '
    f'{_gib(mem["state_params"] + mem["state_optimizer"] + mem["state_ema"])}'
    f', activations+temps {_gib(mem["activations_and_temporaries"])}',
  ]
  if mem.get('peak_with_remat') is not None:
    lines.append(f'  with remat       {_gib(mem["peak_with_remat"])}')
  if mem.get('peak_without_remat') is not None:
    lines.append(f'  without remat    {_gib(mem["peak_without_remat"])}')
  for key in ('peak_with_remat_error', 'peak_without_remat_error'):
    if key in plan:
      lines.append(f'  remat flipped    does not compile: {plan[key][:120]}')
  big = plan['largest_tensor_per_device']
  lines.append(f'largest tensor    {big["shape"]} ({_gib(big["bytes"])})')
  lines.append(f'checkpoint        {_gib(plan["checkpoint_bytes"])}')
  est = plan['estimates']
  lines.append(
    f'{"chip":<6} {"fits":<5} {"step s":>8} {"days":>8}  '
    f'(MFU {est["assumed_mfu"]:.0%}, {est["num_steps"]:,} steps)'
  )
  for name, t in est['per_accelerator'].items():
    fit = plan['fits'][name]
    lines.append(
      f'{name:<6} {"yes" if fit["fits"] else "no":<5} '
      f'{t["step_seconds"]:>8.3f} {t["run_days"]:>8.2f}'
      + ('' if fit['fits'] else '  fix: ' + '; '.join(fit['switches']))
    )
  return '\n'.join(lines)


def write(plan: Mapping, workdir: str) -> str:
  """Writes workdir/plan.json; returns its path."""
  paths.makedirs(workdir)
  path = paths.join(workdir, 'plan.json')
  paths.write_text(path, json.dumps(plan, indent=2, default=str))
  return path


def markdown_rows(plans: Mapping[str, Mapping], chips=('v5p', 'H100')):
  """One docs/LAUNCH.md table row per named plan: params, FLOPs per step,
  peak memory per chip, fits and run days on `chips`."""
  head = (
    '| plan | devices | params | FLOPs/step | peak GiB/chip | '
    + ' | '.join(f'fits {c}' for c in chips)
    + ' | '
    + ' | '.join(f'days on {c}' for c in chips)
    + ' |'
  )
  lines = [head, '|' + '---|' * (5 + 2 * len(chips))]
  for name, p in plans.items():
    est = p['estimates']['per_accelerator']
    fits = [
      'yes'
      if p['fits'][c]['fits']
      else 'no: '
      + ', '.join(s.replace('--config.', '') for s in p['fits'][c]['switches'])
      for c in chips
    ]
    lines.append(
      f'| {name} | {p["devices"]} | {p["params"] / 1e6:.1f}M | '
      f'{p["flops"]["train_step"]:.3g} | '
      f'{p["memory_per_device"]["peak"] / 2**30:.1f} | '
      + ' | '.join(fits)
      + ' | '
      + ' | '.join(f'{est[c]["run_days"]:.2f}' for c in chips)
      + ' |'
    )
  return '\n'.join(lines)
