"""Token layouts of the planner and the executor, with their loss masks.

Both models see fixed fields so that every pipeline jits once:

  planner   [question: Q] [plan: P]
  executor  [question: Q] | [plan: P] = [answer: 1]

The planner's question field is the clean condition; its plan field is what
masked diffusion generates. The executor is causal: the direct ARM sees a
PAD plan field, the CoT ARM writes the plan field itself, the text pipeline
fills it with the planner's plan, and the latent pipeline replaces the plan
field's input embeddings with projected planner hidden states (soft tokens).
Q and the separator ids come from the task (`data.planning_tasks`; the
default is the arithmetic task of reasoning.py).
"""

from __future__ import annotations

import numpy as np

from ddlm_jax.data.planning_tasks import PlanningTask, get_task

LOSS_KINDS = ('answer', 'cot')
TaskLike = PlanningTask | str


def planner_length(plan_len: int, task: TaskLike = 'arithmetic') -> int:
  return get_task(task).question_len + plan_len


def executor_length(plan_len: int, task: TaskLike = 'arithmetic') -> int:
  return get_task(task).question_len + plan_len + 3


def plan_start(plan_len: int, task: TaskLike = 'arithmetic') -> int:
  """First plan-field position in the executor's sequence."""
  del plan_len
  return get_task(task).question_len + 1


def answer_position(plan_len: int, task: TaskLike = 'arithmetic') -> int:
  return get_task(task).question_len + plan_len + 2


def planner_sequence(question_BxQ, plan_BxP) -> np.ndarray:
  """[question, plan] tokens of the planner."""
  return np.concatenate([question_BxQ, plan_BxP], axis=1).astype(np.int32)


def condition_mask(
  batch: int, plan_len: int, task: TaskLike = 'arithmetic'
) -> np.ndarray:
  """True on the planner's clean question positions."""
  mask = np.zeros((batch, planner_length(plan_len, task)), bool)
  mask[:, : get_task(task).question_len] = True
  return mask


def executor_sequence(
  question_BxQ, plan_BxP, answer_B, task: TaskLike = 'arithmetic'
) -> np.ndarray:
  """[question | plan = answer]; plan_BxP all PAD for the direct ARM."""
  batch, t = question_BxQ.shape[0], get_task(task)
  if question_BxQ.shape[1] != t.question_len:
    raise ValueError(
      f'questions of {question_BxQ.shape[1]} tokens; task {t.name!r} has '
      f'{t.question_len}.'
    )
  bar = np.full((batch, 1), t.bar_id, np.int32)
  eq = np.full((batch, 1), t.eq_id, np.int32)
  answer = np.asarray(answer_B, np.int32).reshape(batch, 1)
  return np.concatenate(
    [question_BxQ, bar, plan_BxP, eq, answer], axis=1
  ).astype(np.int32)


def executor_loss_mask(
  batch: int, plan_len: int, kind: str, task: TaskLike = 'arithmetic'
) -> np.ndarray:
  """'answer': the answer token only; 'cot': plan field, '=' and answer."""
  if kind not in LOSS_KINDS:
    raise ValueError(f'loss kind {kind!r}; choose one of {LOSS_KINDS}.')
  mask = np.zeros((batch, executor_length(plan_len, task)), np.float32)
  answer = answer_position(plan_len, task)
  mask[:, answer] = 1.0
  if kind == 'cot':
    mask[:, plan_start(plan_len, task) : answer] = 1.0
  return mask


def pad_plan(
  batch: int, plan_len: int, task: TaskLike = 'arithmetic'
) -> np.ndarray:
  return np.full((batch, plan_len), get_task(task).pad_id, np.int32)
