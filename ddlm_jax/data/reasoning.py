"""Multi-step modular arithmetic: a reasoning task with graded difficulty.

The planner-executor reproduction (arXiv 2510.15244) needs problems
whose answers can be checked exactly, whose difficulty has levels like DART's
1-5, and whose reasoning has a natural written plan. A problem of level k
is a word-free expression of k operations on single digits,

  question  a0 o1 a1 o2 a2 ... ok ak      (o in + - *)
  plan      r1 ; r2 ; ... ; rk ;          (running results)
  answer    rk

evaluated strictly left to right modulo 10: r0 = a0, ri = (r(i-1) oi ai) mod
10. The level is the number of operations, so level k needs k chained steps.

Token ids (one character each): digits 0-9 are ids 0-9, then + - * ; | = and
PAD (`VOCAB`). `|` and `=` are separators of the executor's layout. Questions
are right-padded with PAD to `QUESTION_LEN` (level 5 fills it), plans to a
caller-chosen length >= 2 k.

`generate(num, level, rng, plan_len)` draws problems from a numpy
Generator; splits, seeding and training streams are the task registry's
(`planning_tasks.ARITHMETIC.make_split` / `.stream_batches`), shared with
the other planning tasks.

`evaluate_question` is the independent evaluator: it parses the question
string and evaluates it with exact Python integers, reducing modulo 10 only
once at the end (valid because + - * commute with reduction mod 10), so it
shares no arithmetic code with the generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MODULUS = 10
OPS = ('+', '-', '*')
VOCAB = tuple('0123456789') + OPS + (';', '|', '=', '<pad>')
VOCAB_SIZE = len(VOCAB)  # 17
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}
OP_IDS = tuple(TOKEN_ID[o] for o in OPS)
SEP_ID = TOKEN_ID[';']
BAR_ID = TOKEN_ID['|']
EQ_ID = TOKEN_ID['=']
PAD_ID = TOKEN_ID['<pad>']
MAX_LEVEL = 5
LEVELS = tuple(range(1, MAX_LEVEL + 1))
TRAIN_LEVELS = LEVELS[:-1]
HELDOUT_LEVEL = MAX_LEVEL
PLAN_LEN = 16  # the configs' default plan field (level 5 needs 10)
QUESTION_LEN = 2 * MAX_LEVEL + 1


def plan_tokens_needed(level: int) -> int:
  """Length of the written plan of a level-`level` problem."""
  return 2 * level


def _check_levels(levels: Sequence[int]) -> tuple[int, ...]:
  levels = tuple(int(v) for v in levels)
  if not levels or any(v not in LEVELS for v in levels):
    raise ValueError(f'levels={levels}; each level must be in {LEVELS}.')
  return levels


def _check_plan_len(plan_len: int, levels: Sequence[int]) -> None:
  need = plan_tokens_needed(max(levels))
  if plan_len < need:
    raise ValueError(
      f'plan_len={plan_len} is too short for level {max(levels)} plans '
      f'({need} tokens); use plan_len >= {need}.'
    )


def _solve(operands_NxK1: np.ndarray, ops_NxK: np.ndarray) -> np.ndarray:
  """Running results r_1..r_k (mod 10) of left-to-right evaluation."""
  results = np.zeros(ops_NxK.shape, np.int64)
  r = operands_NxK1[:, 0].astype(np.int64)
  for i in range(ops_NxK.shape[1]):
    a = operands_NxK1[:, i + 1].astype(np.int64)
    op = ops_NxK[:, i]
    r = np.where(op == 0, r + a, np.where(op == 1, r - a, r * a)) % MODULUS
    results[:, i] = r
  return results


def generate(
  num: int, level: int, rng: np.random.Generator, plan_len: int
) -> dict[str, np.ndarray]:
  """`num` problems of one level: question, plan, answer, level arrays."""
  _check_levels([level])
  _check_plan_len(plan_len, [level])
  operands = rng.integers(0, MODULUS, (num, level + 1))
  ops = rng.integers(0, len(OPS), (num, level))
  results = _solve(operands, ops)
  question = np.full((num, QUESTION_LEN), PAD_ID, np.int32)
  question[:, 0] = operands[:, 0]
  question[:, 1 : 2 * level : 2] = np.asarray(OP_IDS)[ops]
  question[:, 2 : 2 * level + 1 : 2] = operands[:, 1:]
  plan = np.full((num, plan_len), PAD_ID, np.int32)
  plan[:, 0 : 2 * level : 2] = results
  plan[:, 1 : 2 * level : 2] = SEP_ID
  return {
    'question': question,
    'plan': plan,
    'answer': results[:, -1].astype(np.int32),
    'level': np.full((num,), level, np.int32),
  }


def decode(tokens: Sequence[int]) -> str:
  """Token ids to text; PAD is dropped."""
  return ''.join(VOCAB[int(t)] for t in tokens if int(t) != PAD_ID)


def encode(text: str, length: int | None = None) -> np.ndarray:
  """Text (one character per token) to ids, right-padded to `length`."""
  ids = []
  for ch in text:
    if ch not in TOKEN_ID:
      raise ValueError(f'character {ch!r} is not in the vocabulary {VOCAB}.')
    ids.append(TOKEN_ID[ch])
  if length is not None:
    if len(ids) > length:
      raise ValueError(f'{text!r} is longer than length={length}.')
    ids += [PAD_ID] * (length - len(ids))
  return np.asarray(ids, np.int32)


def evaluate_question(text: str) -> int:
  """Independent evaluator: exact integers left to right, then mod 10."""
  text = text.strip()
  if not text or len(text) % 2 == 0:
    raise ValueError(f'{text!r} is not `digit (op digit)*`.')
  value = int(text[0])
  for op, digit in zip(text[1::2], text[2::2]):
    if not digit.isdigit():
      raise ValueError(f'{text!r}: expected a digit, got {digit!r}.')
    if op == '+':
      value = value + int(digit)
    elif op == '-':
      value = value - int(digit)
    elif op == '*':
      value = value * int(digit)
    else:
      raise ValueError(f'{text!r}: unknown operator {op!r}.')
  return value % MODULUS


def check_answers(question_BxL, answer_B) -> np.ndarray:
  """Boolean per problem: does answer_B match the independent evaluator."""
  answer_B = np.asarray(answer_B)
  gold = np.asarray([evaluate_question(decode(q)) for q in question_BxL])
  return gold == answer_B


def parse_plan(plan_tokens: Sequence[int]) -> list[int] | None:
  """Running results of a written plan `r1;r2;...;`, or None if malformed."""
  text = decode(plan_tokens)
  if not text.endswith(';'):
    return None
  parts = text[:-1].split(';')
  if not all(len(p) == 1 and p.isdigit() for p in parts):
    return None
  return [int(p) for p in parts]


def plan_correct(question_BxL, plan_BxP) -> np.ndarray:
  """Boolean per problem: the plan is exactly the chain of results."""
  out = []
  for q, p in zip(question_BxL, plan_BxP):
    text = decode(q)
    steps = [
      evaluate_question(text[: 2 * i + 3]) for i in range(len(text) // 2)
    ]
    out.append(parse_plan(p) == steps)
  return np.asarray(out, bool)
