"""4x4 Sudoku with unique solutions: a global-constraint planning task.

Masked diffusion solves Sudoku far better than same-size ARMs (arXiv
2410.14157) because every cell constrains every other: there is no natural
left-to-right order. A problem of level v has `BLANKS[v]` empty cells and a
unique solution; one empty cell is the query:

  question  16 cells, row-major: '1'-'4' given, '.' blank, '?' the query
  plan      the 16-cell solution
  answer    the value of the query cell (one token, needs the plan)

Levels 1-5 have 4, 6, 8, 10, 12 blanks (12 blanks = 4 givens, the fewest a
uniquely solvable 4x4 puzzle can have); level 5 is the held-out one.

Generator: a random solution from the table of all 288 grids, then cells are
removed in random order while the givens still match exactly one grid of the
table (a count vectorised over the batch), restarting a puzzle that gets
stuck before the level's blank count. Verifier (`solutions`,
`count_solutions`): depth-first search over the cells with row / column /
box constraints; it shares no code with the table. Splits are disjoint: a
puzzle's split is a hash of its givens (data/planning_tasks.py).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np

SIZE = 4
BOX = 2
CELLS = SIZE * SIZE
DIGITS = tuple(str(d) for d in range(1, SIZE + 1))
VOCAB = DIGITS + ('.', '?', '|', '=', '<pad>')
VOCAB_SIZE = len(VOCAB)
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}
DIGIT_IDS = tuple(TOKEN_ID[d] for d in DIGITS)
BLANK_ID = TOKEN_ID['.']
QUERY_ID = TOKEN_ID['?']
BAR_ID = TOKEN_ID['|']
EQ_ID = TOKEN_ID['=']
PAD_ID = TOKEN_ID['<pad>']
LEVELS = (1, 2, 3, 4, 5)
BLANKS = {1: 4, 2: 6, 3: 8, 4: 10, 5: 12}
TRAIN_LEVELS = (1, 2, 3, 4)
HELDOUT_LEVEL = 5
QUESTION_LEN = CELLS
PLAN_LEN = CELLS


def plan_tokens_needed(level: int) -> int:
  del level
  return CELLS


# ------------------------------------------------------------- generator


@functools.cache
def all_grids() -> np.ndarray:
  """Every valid 4x4 grid (values 1-4), [288, 16]; the generator's table."""
  perms = np.asarray(list(itertools.permutations(range(1, SIZE + 1))))
  idx = np.indices((len(perms),) * SIZE).reshape(SIZE, -1).T
  g = perms[idx]  # [N, row, col]
  target = np.arange(1, SIZE + 1)
  cols_ok = np.all(np.sort(g, axis=1) == target[None, :, None], axis=(1, 2))
  g = g[cols_ok]
  boxes = g.reshape(-1, BOX, BOX, BOX, BOX).transpose(0, 1, 3, 2, 4)
  boxes = boxes.reshape(-1, SIZE, SIZE)
  boxes_ok = np.all(np.sort(boxes, axis=-1) == target, axis=(1, 2))
  return g[boxes_ok].reshape(-1, CELLS).astype(np.int8)


def _puzzles(rng: np.random.Generator, num: int, blanks: int):
  """(solution_Nx16, given_Nx16) with exactly `blanks` holes, unique.

  All puzzles at once: each removes its cells in its own random order,
  a removal kept when the givens still match one grid of the table;
  puzzles stuck short of `blanks` start again.
  """
  table = all_grids()
  bits = 1 << np.arange(CELLS)
  sol_out = np.zeros((num, CELLS), np.int8)
  given_out = np.zeros((num, CELLS), bool)
  todo = np.arange(num)
  while len(todo):
    n = len(todo)
    sol = table[rng.integers(len(table), size=n)]
    order = np.argsort(rng.random((n, CELLS)), axis=1)
    # Bit c of differ_NxG: grid g differs from the solution at cell c.
    differ_NxG = ((table[None] != sol[:, None]) * bits).sum(-1)
    given = np.ones((n, CELLS), bool)
    rows = np.arange(n)
    for j in range(CELLS):
      active = (~given).sum(1) < blanks
      trial = given.copy()
      trial[rows, order[:, j]] = False
      mask_N = (trial * bits).sum(-1)
      count = ((differ_NxG & mask_N[:, None]) == 0).sum(1)
      given = np.where((active & (count == 1))[:, None], trial, given)
    done = (~given).sum(1) == blanks
    sol_out[todo[done]], given_out[todo[done]] = sol[done], given[done]
    todo = todo[~done]
  return sol_out, given_out


def canonical(question_Q: np.ndarray) -> bytes:
  """The puzzle without its query mark: what decides the split."""
  q = np.where(np.asarray(question_Q) == QUERY_ID, BLANK_ID, question_Q)
  return np.asarray(q, np.int8).tobytes()


def generate(
  num: int, level: int, rng: np.random.Generator, plan_len: int
) -> dict[str, np.ndarray]:
  """`num` puzzles of one level (planning_tasks keeps a split's share)."""
  if level not in LEVELS:
    raise ValueError(f'level={level}; choose one of {LEVELS}.')
  sol_NxC, given_NxC = _puzzles(rng, num, BLANKS[level])
  query_N = np.argmax(np.where(given_NxC, -1.0, rng.random((num, CELLS))), 1)
  digits_NxC = np.asarray(DIGIT_IDS, np.int32)[sol_NxC - 1]
  question = np.where(given_NxC, digits_NxC, BLANK_ID).astype(np.int32)
  rows = np.arange(num)
  question[rows, query_N] = QUERY_ID
  plan = np.full((num, plan_len), PAD_ID, np.int32)
  plan[:, :CELLS] = digits_NxC
  answer = digits_NxC[rows, query_N]
  return {
    'question': question,
    'plan': plan,
    'answer': answer,
    'level': np.full((num,), level, np.int32),
  }


# -------------------------------------------------------------- verifier


def _digit(tok: int) -> int:
  """1-4 for a digit token, 0 for blank / query; ValueError otherwise."""
  tok = int(tok)
  if tok in DIGIT_IDS:
    return DIGIT_IDS.index(tok) + 1
  if tok in (BLANK_ID, QUERY_ID):
    return 0
  raise ValueError(f'token {tok} is not a Sudoku cell.')


def _peers(cell: int) -> set[int]:
  r, c = divmod(cell, SIZE)
  br, bc = r - r % BOX, c - c % BOX
  out = {r * SIZE + j for j in range(SIZE)}
  out |= {i * SIZE + c for i in range(SIZE)}
  out |= {(br + i) * SIZE + bc + j for i in range(BOX) for j in range(BOX)}
  return out - {cell}


_PEERS = tuple(_peers(c) for c in range(CELLS))


def _search(cells: list[int], found: list, limit: int) -> None:
  try:
    cell = cells.index(0)
  except ValueError:
    found.append(tuple(cells))
    return
  used = {cells[p] for p in _PEERS[cell]}
  for d in range(1, SIZE + 1):
    if d not in used:
      cells[cell] = d
      _search(cells, found, limit)
      cells[cell] = 0
      if len(found) >= limit:
        return


def solutions(grid: Sequence[int], limit: int = 2) -> list[tuple[int, ...]]:
  """Up to `limit` solutions (values 1-4) of a grid of values (0 = empty),
  by depth-first search; givens that clash give none."""
  cells = [int(v) for v in grid]
  for c, v in enumerate(cells):
    if v and any(cells[p] == v for p in _PEERS[c]):
      return []
  found: list = []
  _search(cells, found, limit)
  return found


def count_solutions(question_Q, limit: int = 2) -> int:
  """Number of solutions of a question's puzzle, counted up to `limit`."""
  return len(solutions([_digit(t) for t in question_Q], limit))


def _valid_grid(values: Sequence[int]) -> bool:
  rows = [values[r * SIZE : (r + 1) * SIZE] for r in range(SIZE)]
  cols = [values[c::SIZE] for c in range(SIZE)]
  boxes = [
    [values[(br + i) * SIZE + bc + j] for i in range(BOX) for j in range(BOX)]
    for br in range(0, SIZE, BOX)
    for bc in range(0, SIZE, BOX)
  ]
  full = set(range(1, SIZE + 1))
  return all(set(u) == full for u in rows + cols + boxes)


def check_answers(question_BxQ, answer_B) -> np.ndarray:
  """Per puzzle: unique solution and the answer is its query cell's value."""
  out = []
  for q, a in zip(np.asarray(question_BxQ), np.asarray(answer_B)):
    found = solutions([_digit(t) for t in q], 2)
    query = np.flatnonzero(q == QUERY_ID)
    ok = len(found) == 1 and len(query) == 1
    out.append(ok and int(a) == DIGIT_IDS[found[0][int(query[0])] - 1])
  return np.asarray(out, bool)


def plan_correct(question_BxQ, plan_BxP) -> np.ndarray:
  """Per puzzle: the plan is a valid full grid that keeps every given."""
  out = []
  for q, p in zip(np.asarray(question_BxQ), np.asarray(plan_BxP)):
    head, tail = [int(t) for t in p[:CELLS]], p[CELLS:]
    if len(head) < CELLS or any(t not in DIGIT_IDS for t in head):
      out.append(False)
      continue
    values = [DIGIT_IDS.index(t) + 1 for t in head]
    keeps = all(_digit(g) in (0, v) for g, v in zip(q, values))
    out.append(keeps and _valid_grid(values) and bool(np.all(tail == PAD_ID)))
  return np.asarray(out, bool)


def decode(tokens: Sequence[int]) -> str:
  return ''.join(VOCAB[int(t)] for t in tokens if int(t) != PAD_ID)
