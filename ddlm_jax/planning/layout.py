"""Token layouts of the planner and the executor, with their loss masks.

Both models see fixed fields so that every pipeline jits once:

  planner   [question: QUESTION_LEN] [plan: P]
  executor  [question: QUESTION_LEN] | [plan: P] = [answer: 1]

The planner's question field is the clean condition; its plan field is what
masked diffusion generates. The executor is causal: the direct ARM sees a
PAD plan field, the CoT ARM writes the plan field itself, the text pipeline
fills it with the planner's plan, and the latent pipeline replaces the plan
field's input embeddings with projected planner hidden states (soft tokens).
"""

from __future__ import annotations

import numpy as np

from ddlm_jax.data import reasoning as rs

LOSS_KINDS = ('answer', 'cot')


def planner_length(plan_len: int) -> int:
  return rs.QUESTION_LEN + plan_len


def executor_length(plan_len: int) -> int:
  return rs.QUESTION_LEN + plan_len + 3


def plan_start(plan_len: int) -> int:
  """First plan-field position in the executor's sequence."""
  del plan_len
  return rs.QUESTION_LEN + 1


def answer_position(plan_len: int) -> int:
  return rs.QUESTION_LEN + plan_len + 2


def planner_sequence(question_BxQ, plan_BxP) -> np.ndarray:
  """[question, plan] tokens of the planner."""
  return np.concatenate([question_BxQ, plan_BxP], axis=1).astype(np.int32)


def condition_mask(batch: int, plan_len: int) -> np.ndarray:
  """True on the planner's clean question positions."""
  mask = np.zeros((batch, planner_length(plan_len)), bool)
  mask[:, : rs.QUESTION_LEN] = True
  return mask


def executor_sequence(question_BxQ, plan_BxP, answer_B) -> np.ndarray:
  """[question | plan = answer]; plan_BxP all PAD for the direct ARM."""
  batch = question_BxQ.shape[0]
  bar = np.full((batch, 1), rs.BAR_ID, np.int32)
  eq = np.full((batch, 1), rs.EQ_ID, np.int32)
  answer = np.asarray(answer_B, np.int32).reshape(batch, 1)
  return np.concatenate(
    [question_BxQ, bar, plan_BxP, eq, answer], axis=1
  ).astype(np.int32)


def executor_loss_mask(batch: int, plan_len: int, kind: str) -> np.ndarray:
  """'answer': the answer token only; 'cot': plan field, '=' and answer."""
  if kind not in LOSS_KINDS:
    raise ValueError(f'loss kind {kind!r}; choose one of {LOSS_KINDS}.')
  mask = np.zeros((batch, executor_length(plan_len)), np.float32)
  mask[:, answer_position(plan_len)] = 1.0
  if kind == 'cot':
    mask[:, plan_start(plan_len) : answer_position(plan_len)] = 1.0
  return mask


def pad_plan(batch: int, plan_len: int) -> np.ndarray:
  return np.full((batch, plan_len), rs.PAD_ID, np.int32)
