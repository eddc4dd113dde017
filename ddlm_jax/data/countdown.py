"""Countdown: reach a target from a few numbers with + - * /.

A search task (arXiv 2410.14157 has masked diffusion beat same-size ARMs on
it): the first operation can only be chosen once the whole derivation is
known. A problem of level k has k + 1 numbers (1-9) and a target; every
number is used exactly once, every intermediate result is a positive
integer <= MAX_VALUE (Countdown's rules: no negatives, exact division), and
the solution is unique up to commutativity (as an expression tree whose
+ and * children are unordered):

  question  n1 ... n(k+1) [PAD to 4 numbers] : target
  plan      a o b = c ; ... (k steps, 6 tokens each)
  answer    the operator at the root of the unique solution tree

The answer is the root operator, not the first intermediate result that
the issue suggests, because a unique tree can have several serialisations
whose first steps differ ((a+b)*(c-d): either bracket may be written first),
while its root operator is the same for all of them and still needs the
solution. Levels 1-3 (2-4 numbers); level 3 is the held-out one.

Generator: expression trees over subsets of the numbers (bitmask splits),
memoised per multiset; the target is drawn among the values that exactly one
tree reaches. Verifier: the game's own search (pick two numbers, combine,
recurse) over the parsed question, collecting canonical expression strings;
it shares no code with the generator. Splits of levels 2-3 are disjoint by
a hash of the sorted numbers and the target; the one-operation problems of
level 1 (the arithmetic facts) are in every split (see `canonical`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np

MAX_VALUE = 40
MAX_NUMBERS = 4
NUMBER_TOKENS = tuple(str(v) for v in range(MAX_VALUE + 1))
OPS = ('+', '-', '*', '/')
VOCAB = NUMBER_TOKENS + OPS + ('=', ';', ':', '|', '<pad>')
VOCAB_SIZE = len(VOCAB)
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}
OP_IDS = tuple(TOKEN_ID[o] for o in OPS)
STEP_EQ_ID = TOKEN_ID['=']
SEP_ID = TOKEN_ID[';']
COLON_ID = TOKEN_ID[':']
BAR_ID = TOKEN_ID['|']
EQ_ID = STEP_EQ_ID  # the executor's separator; positions keep them apart
PAD_ID = TOKEN_ID['<pad>']
LEVELS = (1, 2, 3)
TRAIN_LEVELS = (1, 2)
HELDOUT_LEVEL = 3
QUESTION_LEN = MAX_NUMBERS + 2
STEP_LEN = 6
PLAN_LEN = STEP_LEN * max(LEVELS)


def plan_tokens_needed(level: int) -> int:
  return STEP_LEN * level


# ------------------------------------------------------------- generator


def _combine(op: str, a: int, b: int) -> int | None:
  """a op b under the rules, or None."""
  if op == '+':
    v = a + b
  elif op == '*':
    v = a * b
  elif op == '-':
    v = a - b
  elif b and a % b == 0:
    v = a // b
  else:
    return None
  return v if 0 < v <= MAX_VALUE else None


@functools.cache
def _trees(numbers: tuple[int, ...]) -> dict[int, list]:
  """value -> distinct trees over all of `numbers` (sorted tuple); a tree
  is a leaf int or (op, left, right), + and * with ordered children so
  each unordered tree appears once."""
  if len(numbers) == 1:
    return {numbers[0]: [numbers[0]]}
  out: dict[int, list] = {}
  n = len(numbers)
  seen = set()
  for mask in range(1, (1 << n) - 1):
    left = tuple(numbers[i] for i in range(n) if mask >> i & 1)
    right = tuple(numbers[i] for i in range(n) if not mask >> i & 1)
    if (left, right) in seen:
      continue  # equal multisets from repeated numbers
    seen.add((left, right))
    for lv, lts in _trees(left).items():
      for rv, rts in _trees(right).items():
        for op in OPS:
          v = _combine(op, lv, rv)
          if v is None:
            continue
          for lt in lts:
            for rt in rts:
              if op in '+*' and repr(lt) > repr(rt):
                continue  # the mirror split lists it once
              out.setdefault(v, []).append((op, lt, rt))
  return out


def _steps(tree) -> list[tuple[int, str, int, int]]:
  """Post-order steps (a, op, b, result) of a tree."""
  if isinstance(tree, int):
    return []
  op, lt, rt = tree
  a = _value(lt)
  b = _value(rt)
  return _steps(lt) + _steps(rt) + [(a, op, b, _combine(op, a, b))]


def _value(tree) -> int:
  if isinstance(tree, int):
    return tree
  return _combine(tree[0], _value(tree[1]), _value(tree[2]))


def generate(
  num: int, level: int, rng: np.random.Generator, plan_len: int
) -> dict[str, np.ndarray]:
  """`num` problems of one level (planning_tasks keeps a split's share)."""
  if level not in LEVELS:
    raise ValueError(f'level={level}; choose one of {LEVELS}.')
  question = np.full((num, QUESTION_LEN), PAD_ID, np.int32)
  plan = np.full((num, plan_len), PAD_ID, np.int32)
  answer = np.zeros((num,), np.int32)
  i = 0
  while i < num:
    numbers = rng.integers(1, 10, level + 1)
    trees = _trees(tuple(sorted(int(v) for v in numbers)))
    unique = sorted(v for v, ts in trees.items() if len(ts) == 1)
    if not unique:
      continue
    target = unique[rng.integers(len(unique))]
    tree = trees[target][0]
    question[i, : level + 1] = numbers
    question[i, -2:] = (COLON_ID, target)
    steps = _steps(tree)
    for j, (a, op, b, c) in enumerate(steps):
      plan[i, STEP_LEN * j : STEP_LEN * (j + 1)] = (
        a, TOKEN_ID[op], b, STEP_EQ_ID, c, SEP_ID
      )  # fmt: skip
    answer[i] = TOKEN_ID[tree[0]]
    i += 1
  return {
    'question': question,
    'plan': plan,
    'answer': answer,
    'level': np.full((num,), level, np.int32),
  }


def canonical(question_Q: np.ndarray) -> bytes | None:
  """Sorted numbers plus target: what decides the split; None (in every
  split) for a one-operation problem.

  Level 1 is the table of arithmetic facts (117 problems in all) that every
  plan is built from. Numbers are atomic tokens, so a fact held out of
  training cannot be inferred from the others: splitting the facts left 8
  distinct test facts, most with training facts of the same numbers and
  another target, and the direct ARM scored 13.5% on them, below the 41%
  of always answering '+'. Sharing them makes level 1 the check that the
  facts were learned, and levels 2-3 (disjoint by problem) the planning
  test.
  """
  q = np.asarray(question_Q)
  nums = np.sort(q[:MAX_NUMBERS])
  if np.count_nonzero(nums != PAD_ID) <= 2:
    return None
  return np.concatenate([nums, q[-1:]]).astype(np.int16).tobytes()


# -------------------------------------------------------------- verifier


def parse_question(question_Q: Sequence[int]) -> tuple[list[int], int]:
  toks = [int(t) for t in question_Q]
  if len(toks) != QUESTION_LEN or toks[-2] != COLON_ID:
    raise ValueError('not a Countdown question: numbers, ":", target.')
  nums = [t for t in toks[:MAX_NUMBERS] if t != PAD_ID]
  if not all(0 < t <= MAX_VALUE for t in nums + [toks[-1]]):
    raise ValueError('Countdown numbers must be number tokens.')
  return nums, toks[-1]


def _apply(op: str, a: int, b: int) -> int | None:
  if op == '/':
    return a // b if b != 0 and a % b == 0 and 0 < a // b <= MAX_VALUE else None
  v = {'+': a + b, '-': a - b, '*': a * b}[op]
  return v if 0 < v <= MAX_VALUE else None


def solutions(question_Q) -> set[str]:
  """Canonical strings of every solution tree: the game's own search."""
  nums, target = parse_question(question_Q)
  found: set[str] = set()

  def search(items: list[tuple[int, str]]):
    if len(items) == 1:
      if items[0][0] == target:
        found.add(items[0][1])
      return
    for i, j in itertools.permutations(range(len(items)), 2):
      (a, ea), (b, eb) = items[i], items[j]
      rest = [items[k] for k in range(len(items)) if k not in (i, j)]
      for op in OPS:
        if op in '+*' and ea > eb:
          continue  # commutative: one order of the children
        v = _apply(op, a, b)
        if v is not None:
          search(rest + [(v, f'({ea}{op}{eb})')])

  search([(n, str(n)) for n in nums])
  return found


def _root_op(expr: str) -> str:
  """Operator at depth 1 of a fully bracketed expression string."""
  depth = 0
  for ch in expr:
    depth += ch == '('
    depth -= ch == ')'
    if depth == 1 and ch in OPS:
      return ch
  raise ValueError(f'{expr!r} has no operator.')


def check_answers(question_BxQ, answer_B) -> np.ndarray:
  """Per problem: a unique solution whose root operator is the answer."""
  out = []
  for q, a in zip(np.asarray(question_BxQ), np.asarray(answer_B)):
    sols = solutions(q)
    out.append(len(sols) == 1 and TOKEN_ID[_root_op(next(iter(sols)))] == a)
  return np.asarray(out, bool)


def plan_correct(question_BxQ, plan_BxP) -> np.ndarray:
  """Per problem: the steps are legal, use every number once, end at the
  target, and are followed by PAD only."""
  out = []
  for q, p in zip(np.asarray(question_BxQ), np.asarray(plan_BxP)):
    nums, target = parse_question(q)
    toks = [int(t) for t in p]
    k = len(nums) - 1
    ok = len(toks) >= STEP_LEN * k and all(
      t == PAD_ID for t in toks[STEP_LEN * k :]
    )
    pool = list(nums)
    for j in range(k if ok else 0):
      a, o, b, eq, c, sep = toks[STEP_LEN * j : STEP_LEN * (j + 1)]
      legal = (
        o in OP_IDS and eq == STEP_EQ_ID and sep == SEP_ID
        and a in pool and b in pool[:pool.index(a)] + pool[pool.index(a) + 1 :]
      )  # fmt: skip
      if not legal or _apply(VOCAB[o], a, b) != c:
        ok = False
        break
      pool.remove(a)
      pool.remove(b)
      pool.append(c)
    out.append(ok and pool == [target])
  return np.asarray(out, bool)


def decode(tokens: Sequence[int]) -> str:
  return ' '.join(VOCAB[int(t)] for t in tokens if int(t) != PAD_ID)
