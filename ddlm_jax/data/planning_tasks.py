"""Planning tasks of the planner -> executor pipelines.

A `PlanningTask` is everything the pipelines need to know about a task:
its vocabulary (with the executor's '|' / '=' separators and PAD), the
question and plan lengths, graded levels with a held-out harder one, a
generator and two independent verifiers. A plan counts as correct when it
is VALID for the question (checked from the question alone), not when it
equals the generator's plan.

  arithmetic  k chained digit operations mod 10 (data/reasoning.py): each
              step needs the previous result, the ARM's home ground.
  sudoku4     4x4 Sudoku, unique solution, graded blanks (data/sudoku.py).
  countdown   reach a target from 2-4 numbers with + - * / (countdown.py).
  paths       unique shortest path in a 10-node graph (data/paths.py).

Seeding and splits: a (seed, split, level) triple has its own numpy stream,
SeedSequence([seed, split_id, level]) for fixed sets and [seed, split_id,
99, step] for training batches, the same as reasoning.py, so `arithmetic`
gives exactly reasoning.py's arrays. The new tasks also keep the splits
disjoint: a problem belongs to the split that a hash of its canonical form
(the question without incidental order) names, 80 / 10 / 10 % for train /
validation / test, and each split's generator keeps only its own problems.
A task may mark problems as shared by every split (canonical form None):
Countdown's one-operation problems, the arithmetic facts its plans are
built from (see countdown.canonical).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ddlm_jax.data import countdown, paths, sudoku
from ddlm_jax.data import reasoning as rs

SPLITS = ('train', 'validation', 'test')
_SPLIT_IDS = {s: i for i, s in enumerate(SPLITS)}


def split_of(canonical: bytes) -> str:
  """The split a problem belongs to, from a hash of its canonical bytes."""
  bucket = zlib.crc32(canonical) % 10
  return 'test' if bucket == 0 else 'validation' if bucket == 1 else 'train'


def in_split(canonical: bytes | None, split: str) -> bool:
  """Whether a problem with this canonical form belongs to `split`; a
  None form (a problem every split shares) belongs to all of them."""
  return canonical is None or split_of(canonical) == split


@dataclasses.dataclass(frozen=True)
class PlanningTask:
  """A planning task (see the module docstring).

  Attributes:
    name: the registry name.
    vocab: token strings; must contain '|', '=' and '<pad>'.
    question_len: Q, questions are PAD-padded to it.
    levels: every level, in order of difficulty.
    train_levels: the levels trained on.
    heldout_level: the harder level seen only at test time.
    plan_len: the default plan field P (fits the longest plan).
    plan_tokens_needed: level -> tokens of that level's plan.
    generate: (num, level, rng, plan_len) -> dict of question, plan,
      answer, level arrays.
    check_answers: (question_BxQ, answer_B) -> bool_B, independent.
    plan_correct: (question_BxQ, plan_BxP) -> bool_B, independent.
    decode: tokens -> text.
    canonical: question row -> bytes deciding its split, or None for a
      problem every split shares (None as the attribute: no split
      partition, as reasoning.py).
  """

  name: str
  vocab: tuple[str, ...]
  question_len: int
  levels: tuple[int, ...]
  train_levels: tuple[int, ...]
  heldout_level: int
  plan_len: int
  plan_tokens_needed: Callable[[int], int]
  generate: Callable
  check_answers: Callable
  plan_correct: Callable
  decode: Callable
  canonical: Callable | None = None

  def __post_init__(self):
    for tok in ('|', '=', '<pad>'):
      if tok not in self.vocab:
        raise ValueError(f'task {self.name}: vocab lacks {tok!r}.')
    if self.heldout_level in self.train_levels:
      raise ValueError(f'task {self.name}: held-out level is a train level.')

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  @property
  def pad_id(self) -> int:
    return self.vocab.index('<pad>')

  @property
  def bar_id(self) -> int:
    return self.vocab.index('|')

  @property
  def eq_id(self) -> int:
    return self.vocab.index('=')

  def check_levels(self, levels: Sequence[int], what='levels') -> tuple:
    levels = tuple(int(v) for v in levels)
    if not levels or any(v not in self.levels for v in levels):
      raise ValueError(
        f'{what}={levels}; each level of task {self.name!r} must be in '
        f'{self.levels}.'
      )
    return levels

  def check_plan_len(self, plan_len: int, levels: Sequence[int]) -> None:
    top = max(levels)
    need = self.plan_tokens_needed(top)
    if plan_len < need:
      raise ValueError(
        f'plan_len={plan_len} is too short for level {top} plans of task '
        f'{self.name!r} ({need} tokens); use plan_len >= {need}.'
      )

  def _draw(self, num, level, rng, plan_len, split) -> dict:
    if self.canonical is None:
      return self.generate(num, level, rng, plan_len)
    parts, have = [], 0
    while have < num:
      chunk = self.generate(max(num - have, 8), level, rng, plan_len)
      keep = [
        i
        for i, q in enumerate(chunk['question'])
        if in_split(self.canonical(q), split)
      ][: num - have]
      parts.append({k: v[keep] for k, v in chunk.items()})
      have += len(keep)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def make_split(
    self,
    split: str,
    levels: Sequence[int],
    num_per_level: int,
    *,
    seed: int,
    plan_len: int,
  ) -> dict[str, np.ndarray]:
    """A fixed set: `num_per_level` problems of each level, level-major."""
    levels = self.check_levels(levels)
    self.check_plan_len(plan_len, levels)
    if num_per_level < 1:
      raise ValueError(f'num_per_level must be >= 1, got {num_per_level}.')
    parts = [
      self._draw(num_per_level, v, _rng(seed, split, v), plan_len, split)
      for v in levels
    ]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def stream_batches(
    self,
    batch: int,
    levels: Sequence[int],
    *,
    seed: int,
    plan_len: int,
    split: str = 'train',
    start: int = 0,
  ) -> Iterator[dict[str, np.ndarray]]:
    """Endless fresh batches; levels uniform; batch i depends on (seed, i)."""
    levels = self.check_levels(levels)
    self.check_plan_len(plan_len, levels)
    _rng(seed, split, 0)  # checks the split
    step = start
    while True:
      rng = np.random.default_rng(
        np.random.SeedSequence([int(seed), _SPLIT_IDS[split], 99, step])
      )
      lv = rng.choice(np.asarray(levels), batch)
      parts = [
        self._draw(int(np.sum(lv == v)), v, rng, plan_len, split)
        for v in levels
        if np.any(lv == v)
      ]
      out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
      order = rng.permutation(batch)
      yield {k: v[order] for k, v in out.items()}
      step += 1


def _rng(seed: int, split: str, level: int) -> np.random.Generator:
  if split not in _SPLIT_IDS:
    raise ValueError(f'split={split!r}; choose one of {SPLITS}.')
  return np.random.default_rng(
    np.random.SeedSequence([int(seed), _SPLIT_IDS[split], int(level)])
  )


def _module_task(name: str, mod) -> PlanningTask:
  return PlanningTask(
    name=name,
    vocab=tuple(mod.VOCAB),
    question_len=mod.QUESTION_LEN,
    levels=tuple(mod.LEVELS),
    train_levels=tuple(mod.TRAIN_LEVELS),
    heldout_level=mod.HELDOUT_LEVEL,
    plan_len=mod.PLAN_LEN,
    plan_tokens_needed=mod.plan_tokens_needed,
    generate=mod.generate,
    check_answers=mod.check_answers,
    plan_correct=mod.plan_correct,
    decode=mod.decode,
    canonical=getattr(mod, 'canonical', None),
  )


ARITHMETIC = _module_task('arithmetic', rs)
SUDOKU4 = _module_task('sudoku4', sudoku)
COUNTDOWN = _module_task('countdown', countdown)
PATHS = _module_task('paths', paths)
TASKS = {t.name: t for t in (ARITHMETIC, SUDOKU4, COUNTDOWN, PATHS)}
TASK_NAMES = tuple(TASKS)


def get_task(task: str | PlanningTask) -> PlanningTask:
  """A registered task by name (a PlanningTask passes through)."""
  if isinstance(task, PlanningTask):
    return task
  if task not in TASKS:
    raise ValueError(f'unknown task {task!r}; choose one of {TASK_NAMES}.')
  return TASKS[task]
