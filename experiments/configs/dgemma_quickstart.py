"""DiffusionGemma's training recipe at CPU scale, on the quickstart corpus.

Uniform-state block diffusion (no mask token: a canvas starts as random
characters) with DiffusionGemma's encoder/decoder split and
self-conditioning (ddlm_jax/diffusion/dgemma.py): a causal encoder over
the clean earlier blocks writes the KV cache, a bidirectional decoder with
the same weights denoises the current 16-character canvas reading it, and
with probability 0.5 per sequence the first decoder pass's logits (gradient
stopped) enter the second pass through the self-conditioning module. The
network is a small DiffusionGemma ('diffusion_gemma' backbone: sliding-
window layers and a full-attention last layer, q/k norms, grouped-query
attention, a dense MLP plus a top-2 of 4 experts per layer, soft-capped
tied logits). The bound is the uniform-state (UDLM) continuous-time NELBO
per block, conditioned on the clean earlier blocks, summed over blocks.
Samples use the entropy-bound canvas sampler (temperature annealed 0.8 ->
0.4, at most `sample.steps` decoder calls per canvas, early stop once the
canvas is stable and confident).

Commands:
  python -m experiments.run --config=experiments/configs/dgemma_quickstart.py \
    --workdir=runs/dgemma_quickstart
  python -m experiments.run \
    --config=experiments/configs/dgemma_quickstart.py:nosc \
    --workdir=runs/dgemma_quickstart_nosc

Argument: '[nosc][,smoke]': `nosc` switches self-conditioning off (one
decoder pass per step, p = 0); `smoke` is the seconds-long test preset
(32 characters in blocks of 8, width 32).

Everything else is the quickstart recipe (corpus, 128 characters,
optimiser, 1000 steps of batch 32), so the bound compares with the UDLM
twin (duo_quickstart.py) and the BD3 twin (bd3_quickstart.py:16,scratch).
experiments/claims/dgemma.py holds the comparisons (3 seeds, equal training
FLOPs) and their commands. The bound against the UDLM twin is measured
(docs/RESULTS.md); each run of this recipe takes about an hour on two CPU
cores, so the BD3, self-conditioning and sampling comparisons (9 runs and
the sampling sweep) are not yet measured.
"""

from experiments.configs import common, quickstart

SMOKE_ARG = 'smoke'
ARGS = (common.Flag('nosc'),)  # '[nosc][,smoke]'

# Keys of the transformer backbones the DiffusionGemma model does not take.
_TRANSFORMER_ONLY = (
  'mlp_kind', 'cond_dim', 'tied_embeddings', 'remat', 'pattern', 'ssm_kind',
  'state_size', 'num_dict', 'scan_impl',
)  # fmt: skip


def set_dgemma_model(c, preset: str = ''):
  """config.model as the 'diffusion_gemma' backbone at this scale."""
  for key in _TRANSFORMER_ONLY:
    if key in c.model:
      del c.model[key]
  c.model.backbone = 'diffusion_gemma'
  c.model.time_conditioning = False  # The canvas shows its noise level.
  c.model.layer_pattern = ''  # Sliding layers, then one full layer.
  c.model.kv_heads = 2
  c.model.sliding_window = 32
  c.model.num_experts = 4
  c.model.top_k_experts = 2
  c.model.moe_mlp_dim = 0  # = width
  c.model.logit_softcap = 30.0
  if preset == 'smoke':
    c.model.depth = 2  # One sliding and one full layer.
    c.model.sliding_window = 8
  return c


def get_config(arg: str = ''):
  nosc, preset = common.parse_arg(arg, *ARGS)
  c = quickstart.recipe(preset)
  block = 8 if preset == 'smoke' else 16
  common.set_process(
    c,
    'dgemma',
    schedule='loglinear',
    block_size=block,
    self_conditioning=0.0 if nosc else 0.5,
  )
  set_dgemma_model(c, preset)
  c.sample.sampler = 'entropy_bound_canvas'
  c.sample.steps = 16 if preset == 'smoke' else 48  # Step cap per canvas.
  return c
