"""The four planner/executor pipelines as pure, jit-compiled functions.

  direct  the AR executor answers from the question alone.
  cot     the AR executor writes its own plan (chain of thought), then the
          answer; greedy or sampled, one network call per generated token.
  text    the MDLM planner samples a P-token plan for the question with a
          registry sampler; the executor reads it as text and answers.
  latent  the planner's final hidden states at the P plan positions go
          through the projector into the executor's embedding space and
          replace the plan field's input embeddings (soft tokens); the
          executor answers. `latent_source` 'final' takes the states of one
          extra planner call on the sampled (fully unmasked) sequence;
          'masked' takes them from a single call with the plan all masked,
          skipping the planner's text generation entirely.

Every pipeline maps (params, key, question_BxQ) to a dict with the answer,
the plan it used (if any), the planner's and executor's network calls (NFE)
and the tokens the executor generated; the same key gives the same output.
`pipeline_flops` turns those counts into FLOPs per problem. The task
(`PipelineSpec.task`, a `data.planning_tasks` name) fixes the vocabulary,
the question length and the separator ids; the default is arithmetic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from ddlm_jax.data.planning_tasks import get_task
from ddlm_jax.diffusion.masked import MaskedDiffusion
from ddlm_jax.diffusion.schedules import LogLinearSchedule
from ddlm_jax.evaluation.cost import transformer_flops
from ddlm_jax.planning import conditional, layout
from ddlm_jax.planning import models as pm
from ddlm_jax.sampling.base import Sampler
from ddlm_jax.sampling.noise import filter_logits, sample_categorical

PIPELINES = ('direct', 'cot', 'text', 'latent')
LATENT_SOURCES = ('final', 'masked')


def planner_process(
  loss_type: str = 'elbo', task: str = 'arithmetic'
) -> MaskedDiffusion:
  """The planner's masked-diffusion process (MDLM log-linear schedule).

  `loss_type` only changes the training objective ('elbo' or 'simple_ce');
  sampling is the same for both. The mask id is the task's vocab size.
  """
  return MaskedDiffusion(
    LogLinearSchedule(), get_task(task).vocab_size, loss_type=loss_type
  )


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
  """Static settings of a pipeline (hashable: part of the jit cache key).

  Attributes:
    name: one of PIPELINES.
    plan_len: P, the plan field's length.
    sampler: the planner's sampler (text; latent with source 'final').
    latent_source: 'final' or 'masked' (see the module docstring).
    exec_temperature: 0 for greedy executor decoding, else sampling.
    task: the planning task's registry name.
  """

  name: str
  plan_len: int
  sampler: Sampler | None = None
  latent_source: str = 'final'
  exec_temperature: float = 0.0
  task: str = 'arithmetic'

  def __post_init__(self):
    task = get_task(self.task)  # ValueError naming the tasks
    if self.name not in PIPELINES:
      raise ValueError(f'pipeline {self.name!r}; choose one of {PIPELINES}.')
    if self.latent_source not in LATENT_SOURCES:
      raise ValueError(
        f'latent_source={self.latent_source!r}; choose one of {LATENT_SOURCES}.'
      )
    need = task.plan_tokens_needed(min(task.levels))
    if self.plan_len < need:
      raise ValueError(
        f'plan_len must be >= {need} for task {task.name!r}, got '
        f'{self.plan_len}.'
      )
    needs_sampler = self.name == 'text' or (
      self.name == 'latent' and self.latent_source == 'final'
    )
    if needs_sampler and self.sampler is None:
      raise ValueError(f'pipeline {self.name!r} needs a planner sampler.')
    if self.exec_temperature < 0:
      raise ValueError('exec_temperature must be >= 0 (0 = greedy).')


def _pick(key, logits_BxV, temperature: float):
  if temperature == 0:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits = filter_logits(logits_BxV, temperature=temperature)
  return sample_categorical(key, jax.nn.log_softmax(logits, -1)).astype(
    jnp.int32
  )


def _answer(executor, key, tokens_BxL, soft, spec: PipelineSpec):
  logits = pm.executor_logits(executor, tokens_BxL, soft)
  pos = layout.answer_position(spec.plan_len, spec.task)
  return _pick(key, logits[:, pos], spec.exec_temperature)


def _exec_tokens(question_BxQ, plan_BxP, task: str):
  """[question | plan = PAD]: the executor's input with the answer unset."""
  batch, t = question_BxQ.shape[0], get_task(task)
  if question_BxQ.shape[1] != t.question_len:
    raise ValueError(
      f'questions of {question_BxQ.shape[1]} tokens; task {t.name!r} has '
      f'{t.question_len}.'
    )
  bar = jnp.full((batch, 1), t.bar_id, jnp.int32)
  eq = jnp.full((batch, 1), t.eq_id, jnp.int32)
  ans = jnp.full((batch, 1), t.pad_id, jnp.int32)
  return jnp.concatenate(
    [question_BxQ.astype(jnp.int32), bar, plan_BxP.astype(jnp.int32), eq, ans],
    axis=1,
  )


def _pad_plan(batch: int, plan_len: int, task: str):
  return jnp.full((batch, plan_len), get_task(task).pad_id, jnp.int32)


def _cot_generate(executor, key, question_BxQ, spec: PipelineSpec):
  """Greedy/sampled left-to-right decoding of plan field, '=' and answer."""
  batch, plan_len = question_BxQ.shape[0], spec.plan_len
  task = spec.task
  tokens = _exec_tokens(question_BxQ, _pad_plan(batch, plan_len, task), task)
  first = layout.plan_start(plan_len, task)
  last = layout.answer_position(plan_len, task)

  def step(i, carry):
    tokens, key = carry
    key, sub = jax.random.split(key)
    logits = pm.executor_logits(executor, tokens)
    logits_BxV = jax.lax.dynamic_index_in_dim(logits, i, 1, keepdims=False)
    tok = _pick(sub, logits_BxV, spec.exec_temperature)
    return jax.lax.dynamic_update_index_in_dim(tokens, tok, i, 1), key

  tokens, _ = jax.lax.fori_loop(first, last + 1, step, (tokens, key))
  return tokens, last + 1 - first


def run(spec: PipelineSpec, graphdefs: dict, params: dict, key, question_BxQ):
  """One pipeline on a batch of questions (pure; jit with `make_runner`).

  Args:
    spec: the static settings.
    graphdefs: {'planner', 'executor', 'projector'} NNX graphdefs (those the
      pipeline uses).
    params: pure parameter dicts under the same names.
    key: the pipeline's randomness (planner sampling, executor sampling).
    question_BxQ: question tokens, PAD-padded to the task's question_len.

  Returns:
    dict: answer_B, plan_BxP (the plan the executor read or wrote; PAD for
    direct and latent-masked), plan_nfe, exec_nfe (scalars) and
    exec_tokens_B (non-PAD tokens the executor generated).
  """
  batch, plan_len, task = question_BxQ.shape[0], spec.plan_len, spec.task
  pad_id = get_task(task).pad_id
  plan_key, exec_key = jax.random.split(key)
  executor = pm.merge(graphdefs['executor'], params['executor'])
  zero = jnp.int32(0)
  if spec.name == 'cot':
    tokens, nfe = _cot_generate(executor, exec_key, question_BxQ, spec)
    gen = tokens[:, layout.plan_start(plan_len, task) :]
    return {
      'answer_B': tokens[:, -1],
      'plan_BxP': gen[:, :plan_len],
      'plan_nfe': zero,
      'exec_nfe': jnp.int32(nfe),
      'exec_tokens_B': jnp.sum(gen != pad_id, axis=-1).astype(jnp.int32),
    }
  one_token = jnp.ones((batch,), jnp.int32)
  if spec.name == 'direct':
    tokens = _exec_tokens(question_BxQ, _pad_plan(batch, plan_len, task), task)
    return {
      'answer_B': _answer(executor, exec_key, tokens, None, spec),
      'plan_BxP': _pad_plan(batch, plan_len, task),
      'plan_nfe': zero,
      'exec_nfe': jnp.int32(1),
      'exec_tokens_B': one_token,
    }
  planner = pm.merge(graphdefs['planner'], params['planner'])
  process = planner_process(task=task)
  apply = lambda z, t: planner(z)
  if spec.name == 'text' or spec.latent_source == 'final':
    plan, plan_nfe, z_BxL = conditional.sample_plan(
      spec.sampler, apply, plan_key, process, question_BxQ, plan_len
    )
  else:
    z_BxL = conditional.plan_prompt(question_BxQ, plan_len, process.mask_id)
    plan, plan_nfe = _pad_plan(batch, plan_len, task), zero
  if spec.name == 'text':
    tokens = _exec_tokens(question_BxQ, plan, task)
    answer = _answer(executor, exec_key, tokens, None, spec)
  else:
    projector = pm.merge(graphdefs['projector'], params['projector'])
    h_BxPxD = pm.planner_hidden(planner, z_BxL)[:, -plan_len:]
    soft_BxPxD = projector(h_BxPxD)
    tokens = _exec_tokens(question_BxQ, _pad_plan(batch, plan_len, task), task)
    answer = _answer(executor, exec_key, tokens, soft_BxPxD, spec)
    plan_nfe = plan_nfe + 1
  return {
    'answer_B': answer,
    'plan_BxP': plan,
    'plan_nfe': jnp.int32(plan_nfe),
    'exec_nfe': jnp.int32(1),
    'exec_tokens_B': one_token,
  }


# Cheap XLA compilation for smoke runs and tests.
FAST_COMPILE = {
  'xla_backend_optimization_level': 0,
  'xla_llvm_disable_expensive_passes': True,
}


def make_runner(spec: PipelineSpec, graphdefs: dict, fast_compile=False):
  """jit(run) for fixed spec and graphdefs: (params, key, question) -> out."""

  def runner(params, key, question_BxQ):
    return run(spec, graphdefs, params, key, question_BxQ)

  return jax.jit(
    runner, compiler_options=FAST_COMPILE if fast_compile else None
  )


def pipeline_flops(
  spec: PipelineSpec,
  configs: dict,
  plan_nfe: float,
  exec_nfe: float,
  projector: Any = None,
) -> dict:
  """FLOPs per problem, as run and with an ideal KV-cached executor.

  As run: every planner call is a full pass over [question, plan]; every
  executor call a full pass over its sequence (no KV cache). With a KV
  cache and stopping at the last content token, the executor's cost is one
  pass over the prompt plus its generated tokens, which we bound by one
  full pass (`exec_kv`).

  Args:
    configs: {'planner', 'executor'} TransformerConfigs.
  """
  plan_len, task = spec.plan_len, spec.task
  exec_call = transformer_flops(
    configs['executor'], 1, layout.executor_length(plan_len, task)
  )
  plan_call = (
    transformer_flops(
      configs['planner'], 1, layout.planner_length(plan_len, task)
    )
    if 'planner' in configs
    else 0.0
  )
  planner = plan_nfe * plan_call
  proj = 0.0
  if spec.name == 'latent' and projector is not None:
    proj = pm.projector_flops(projector, plan_len)
  return {
    'planner_flops': planner,
    'projector_flops': proj,
    'executor_flops': exec_nfe * exec_call,
    'flops': planner + proj + exec_nfe * exec_call,
    'flops_kv': planner + proj + exec_call,
  }
