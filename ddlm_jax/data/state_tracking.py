"""State-tracking benchmark data (PD-SSM paper; Deletang / Walker et al.).

Deterministic numpy generators for the formal-language tasks on which the
PD-SSM paper (arXiv 2509.22284) compares sequence models:

- ``parity``: tokens a, b; label = (number of b) mod 2.
- ``even_pairs``: tokens a, b; label = 1 iff first symbol == last symbol.
- ``cycle_nav``: tokens STAY, +1, -1 moving on a cycle of 5 that starts at 0;
  label = final position (5 classes).
- ``mod_arith``: valid bracket-free expressions over the numbers 0-4 and the
  operators + - x, evaluated mod 5 with x binding tighter than + and -;
  label = value (5 classes). Expressions have odd length (number, op, number,
  ..., number), so lengths are uniform over the ODD values in
  [min_len, max_len].
- ``a5`` / ``s5``: group word problems. Tokens are group elements (all of the
  group, or ``num_generators`` random fixed elements that generate the whole
  group); label = product of the sequence. ``s3`` (in ``GROUP_TASKS``, 6
  elements, the smallest non-abelian group) is the cheap diagnostic: its
  regular representation fits a PD-SSM state of N = 6, so a trainable PD-SSM
  must solve it at CPU budget. ``a4`` (every one of the 12 even
  permutations of 4 points is a token) and ``a4_gen`` (two fixed
  generators, the 3-cycle (0 1 2) and the double transposition (0 1)(2 3))
  are the next size up. ``GROUP_TASKS`` are reachable through every
  function here but kept out of ``TASKS`` (the benchmark table's registry).
  ``prefix_labels=True`` adds the product of every prefix (the per-token
  supervision of the Merrill et al. / Walker et al. A5 data).

Permutation convention (explicit, used everywhere in this module): an element
of S_n is a tuple ``g`` with ``g[i]`` = image of point ``i``; S_n elements
are indexed in lexicographic order of ``itertools.permutations(range(n))``
(n = 5 for S5, 3 for S3), A5 and A4 elements are the even permutations of 5
and 4 points in the same order. The word g_1 g_2 ... g_L
is multiplied LEFT TO RIGHT with "apply the left factor first":
(g * h)[i] = h[g[i]], so the label is the permutation
i -> g_L[...g_2[g_1[i]]...], and the running state is s_t = s_{t-1} * g_t.

Token ids: ``PAD_ID = 0`` for every task, real tokens are 1..V-1 (see
``TASKS[task].token_names``). Sequences are right-padded with PAD to the split's
``max_len``; models read the label off the LAST REAL token (index
``lengths - 1``).

Seeding: every (task, split, seed) triple gets its own ``np.random.Generator``
built from ``SeedSequence([seed, crc32(task), split_id])``; train, validation
and test therefore draw different streams from one seed, and repeating a call
gives identical arrays. The random generator set of a group task depends only
on ``generator_seed`` so that it is shared by all splits.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import zlib
from collections.abc import Iterator

import numpy as np

PAD_ID = 0
SPLITS = ('train', 'validation', 'test')
_SPLIT_IDS = {'train': 0, 'validation': 1, 'test': 2}
# Default (min_len, max_len) per split: train short, evaluation long.
DEFAULT_LENGTHS = {
  'train': (3, 40),
  'validation': (40, 256),
  'test': (40, 256),
}
MODULUS = 5
CYCLE_SIZE = 5


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Static description of one task.

  Attributes:
    name: registry key.
    token_names: names of real tokens; token id = 1 + position in this tuple.
    num_classes: number of labels.
    odd_lengths_only: expressions must have odd length (mod_arith).
    group: 'A5' / 'S5' / 'S3' / 'A4' for word problems, else None.
    generators: a group task's fixed token elements as permutation tuples
      (images of the points); empty: every element, or ``num_generators``
      random ones.
  """

  name: str
  token_names: tuple[str, ...]
  num_classes: int
  odd_lengths_only: bool = False
  group: str | None = None
  generators: tuple[tuple[int, ...], ...] = ()


# ----------------------------------------------------------------------------
# Groups.


# Group name -> (number of points, even permutations only).
GROUPS = {
  'S5': (5, False),
  'A5': (5, True),
  'S3': (3, False),
  'A4': (4, True),
}


@functools.cache
def group_elements(group: str) -> np.ndarray:
  """Elements of a group in ``GROUPS`` as an int array [G, n] of images."""
  if group not in GROUPS:
    raise ValueError(f'unknown group {group!r}; use one of {sorted(GROUPS)}.')
  points, even_only = GROUPS[group]
  perms = np.array(list(itertools.permutations(range(points))), np.int64)
  if even_only:
    perms = perms[np.array([_sign(p) == 1 for p in perms])]
  perms.setflags(write=False)
  return perms


def _sign(perm: np.ndarray) -> int:
  """Sign of a permutation via its inversion count."""
  inv = sum(
    1
    for i in range(len(perm))
    for j in range(i + 1, len(perm))
    if perm[i] > perm[j]
  )
  return -1 if inv % 2 else 1


@functools.cache
def group_table(group: str) -> np.ndarray:
  """Multiplication table T[a, b] = index of a * b (apply a, then b)."""
  elems = group_elements(group)
  index = {tuple(p): k for k, p in enumerate(elems)}
  # (a * b)[i] = b[a[i]]  ->  with index arrays: elems[b][elems[a]].
  table = np.empty((len(elems), len(elems)), dtype=np.int64)
  for a in range(len(elems)):
    for b in range(len(elems)):
      table[a, b] = index[tuple(elems[b][elems[a]])]
  table.setflags(write=False)
  return table


def group_identity(group: str) -> int:
  """Index of the identity permutation (0 for every group: lexicographic)."""
  elems = group_elements(group)
  ident = np.arange(elems.shape[1])
  return int(np.flatnonzero((elems == ident).all(-1))[0])


def generated_subgroup(group: str, gens) -> np.ndarray:
  """Sorted indices of the subgroup generated by ``gens`` (closure by BFS).

  A finite set closed under the product is a subgroup, so right-multiplying
  by the generators from the identity reaches exactly <gens>.
  """
  table = group_table(group)
  seen = {group_identity(group)}
  frontier = list(seen)
  while frontier:
    nxt = []
    for a in frontier:
      for g in gens:
        b = int(table[a, int(g)])
        if b not in seen:
          seen.add(b)
          nxt.append(b)
    frontier = nxt
  return np.array(sorted(seen), np.int64)


def group_generators(
  group: str, num_generators: int | None, generator_seed: int = 0
) -> np.ndarray:
  """Group elements used as tokens: all (None) or k random non-identity ones.

  The k distinct elements must generate the whole group (the paper's (G, k)
  automata are Cayley graphs of G): a draw that generates a proper subgroup
  is redrawn from the same stream, so a first draw that generates is kept
  as it was before this check existed. The choice depends only on (group,
  num_generators, generator_seed), so every split of a task shares it.
  Returned sorted.
  """
  size = len(group_elements(group))
  if num_generators is None:
    return np.arange(size)
  if not 1 <= num_generators < size:
    raise ValueError(
      f'num_generators={num_generators} must be in [1, {size - 1}] for '
      f'{group} (or None for all elements).'
    )
  rng = np.random.default_rng([generator_seed, zlib.crc32(group.encode())])
  ident = group_identity(group)
  candidates = np.array([k for k in range(size) if k != ident])
  for _ in range(1000):
    gens = np.sort(rng.choice(candidates, size=num_generators, replace=False))
    if len(generated_subgroup(group, gens)) == size:
      return gens
  raise ValueError(
    f'no set of {num_generators} elements generating {group} found in 1000 '
    'draws (every non-abelian simple group needs >= 2); raise num_generators.'
  )


# ----------------------------------------------------------------------------
# Registry.

TASKS: dict[str, TaskSpec] = {
  'parity': TaskSpec('parity', ('a', 'b'), 2),
  'even_pairs': TaskSpec('even_pairs', ('a', 'b'), 2),
  'cycle_nav': TaskSpec('cycle_nav', ('STAY', '+1', '-1'), CYCLE_SIZE),
  'mod_arith': TaskSpec(
    'mod_arith',
    ('0', '1', '2', '3', '4', '+', '-', 'x'),
    MODULUS,
    odd_lengths_only=True,
  ),
  'a5': TaskSpec('a5', (), 60, group='A5'),
  's5': TaskSpec('s5', (), 120, group='S5'),
}
# Diagnostic word problems: every function of this module accepts them, the
# benchmark registry (TASKS, the configs' task list) does not list them.
GROUP_TASKS: dict[str, TaskSpec] = {
  's3': TaskSpec('s3', (), 6, group='S3'),
  'a4': TaskSpec('a4', (), 12, group='A4'),
  # A 3-cycle and a double transposition: together they generate A4.
  'a4_gen': TaskSpec(
    'a4_gen', (), 12, group='A4', generators=((1, 2, 0, 3), (1, 0, 3, 2))
  ),
}

# mod_arith token ids.
_NUM_IDS = np.arange(1, 6)  # digit d -> id d + 1
_PLUS, _MINUS, _TIMES = 6, 7, 8


def task_spec(task: str) -> TaskSpec:
  """The TaskSpec of a benchmark task or a diagnostic group task."""
  if task in TASKS:
    return TASKS[task]
  if task in GROUP_TASKS:
    return GROUP_TASKS[task]
  raise ValueError(
    f'unknown task {task!r}; choose one of {sorted(TASKS)} '
    f'(or the diagnostic group tasks {sorted(GROUP_TASKS)}).'
  )


def _check_group_kwargs(
  spec: TaskSpec, num_generators: int | None, prefix_labels: bool = False
) -> None:
  if spec.group is None and (num_generators is not None or prefix_labels):
    raise ValueError(
      'num_generators and prefix_labels apply only to group tasks (a5, s5, '
      f'{", ".join(GROUP_TASKS)}), not {spec.name!r}.'
    )
  if spec.generators and num_generators is not None:
    raise ValueError(
      f'{spec.name} has {len(spec.generators)} fixed generators; leave '
      f'num_generators unset (0 in a config), got {num_generators}.'
    )


def task_generators(
  task: str, num_generators: int | None = None, generator_seed: int = 0
) -> np.ndarray:
  """Element indices of a group task's tokens (token id = 1 + position).

  The task's fixed ``generators`` when it has them, else
  ``group_generators`` (every element, or k random ones).
  """
  spec = task_spec(task)
  if spec.group is None:
    raise ValueError(f'{task!r} is not a group task.')
  _check_group_kwargs(spec, num_generators)
  if spec.generators:
    elems = group_elements(spec.group)
    index = {tuple(int(i) for i in p): k for k, p in enumerate(elems)}
    return np.array([index[tuple(g)] for g in spec.generators], np.int64)
  return group_generators(spec.group, num_generators, generator_seed)


def task_info(
  task: str, *, num_generators: int | None = None
) -> tuple[int, int]:
  """Returns (vocab_size including PAD, num_classes) for a task."""
  spec = task_spec(task)
  _check_group_kwargs(spec, num_generators)
  if spec.group is not None:
    n_tok = len(task_generators(task, num_generators))
    return n_tok + 1, spec.num_classes
  return len(spec.token_names) + 1, spec.num_classes


# ----------------------------------------------------------------------------
# Generation.


def _sample_lengths(
  rng: np.random.Generator, spec: TaskSpec, num: int, lo: int, hi: int
) -> np.ndarray:
  if not spec.odd_lengths_only:
    return rng.integers(lo, hi + 1, size=num)
  # Uniform over the odd lengths in [lo, hi].
  odd_lo, odd_hi = lo + (lo % 2 == 0), hi - (hi % 2 == 0)
  return odd_lo + 2 * rng.integers(0, (odd_hi - odd_lo) // 2 + 1, size=num)


def _labels_mod_arith(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Vectorised left-to-right evaluation with x before +/- (mod 5).

  State: ``total`` = sum of finished terms, ``term`` = product of the current
  term so far (without its sign), ``sign`` of the current term.
  """
  num = tokens.shape[0]
  total = np.zeros(num, np.int64)
  term = tokens[:, 0] - 1
  sign = np.ones(num, np.int64)
  for pos in range(1, int(lengths.max()), 2):
    active = pos + 1 < lengths  # operator at pos, number at pos + 1
    op = tokens[:, pos]
    val = tokens[:, pos + 1] - 1
    is_mul = op == _TIMES
    new_term = np.where(is_mul, term * val, val) % MODULUS
    new_total = np.where(is_mul, total, total + sign * term) % MODULUS
    new_sign = np.where(is_mul, sign, np.where(op == _PLUS, 1, -1))
    term = np.where(active, new_term, term)
    total = np.where(active, new_total, total)
    sign = np.where(active, new_sign, sign)
  return (total + sign * term) % MODULUS


def _generate(
  spec: TaskSpec,
  rng: np.random.Generator,
  num: int,
  min_len: int,
  max_len: int,
  pad_to: int,
  num_generators: int | None,
  generator_seed: int,
  prefix_labels: bool = False,
) -> dict[str, np.ndarray]:
  lengths = _sample_lengths(rng, spec, num, min_len, max_len)
  prefix = None
  pos_L = np.arange(pad_to)
  mask_NxL = pos_L[None, :] < lengths[:, None]
  if spec.name in ('parity', 'even_pairs', 'cycle_nav'):
    raw = rng.integers(0, len(spec.token_names), size=(num, pad_to))
    if spec.name == 'parity':
      labels = ((raw == 1) & mask_NxL).sum(1) % 2
    elif spec.name == 'even_pairs':
      last = raw[np.arange(num), lengths - 1]
      labels = (raw[:, 0] == last).astype(np.int64)
    else:
      step = np.array([0, 1, -1])[raw]
      labels = (step * mask_NxL).sum(1) % CYCLE_SIZE
    tokens = raw + 1
  elif spec.name == 'mod_arith':
    nums = rng.integers(0, MODULUS, size=(num, pad_to)) + 1
    ops = rng.integers(_PLUS, _TIMES + 1, size=(num, pad_to))
    tokens = np.where(pos_L[None, :] % 2 == 0, nums, ops)
    labels = _labels_mod_arith(tokens, lengths)
  else:
    gens = task_generators(spec.name, num_generators, generator_seed)
    table = group_table(spec.group)
    raw = rng.integers(0, len(gens), size=(num, pad_to))
    elem = gens[raw]
    state = np.full(num, group_identity(spec.group), np.int64)
    prefix = np.zeros((num, pad_to), np.int64)
    for t in range(int(lengths.max())):
      state = np.where(mask_NxL[:, t], table[state, elem[:, t]], state)
      prefix[:, t] = state
    labels = state
    tokens = raw + 1
  tokens = np.where(mask_NxL, tokens, PAD_ID)
  out = {
    'tokens': tokens.astype(np.int32),
    'lengths': lengths.astype(np.int32),
    'labels': labels.astype(np.int32),
  }
  if prefix_labels:
    # Product of tokens[:t + 1]; 0 on padding (mask it with ``lengths``).
    out['prefix_labels'] = np.where(mask_NxL, prefix, 0).astype(np.int32)
  return out


def _resolve_lengths(
  spec: TaskSpec, split: str, min_len: int | None, max_len: int | None
) -> tuple[int, int]:
  if split not in SPLITS:
    raise ValueError(f'unknown split {split!r}; choose one of {SPLITS}.')
  lo, hi = DEFAULT_LENGTHS[split]
  lo = lo if min_len is None else int(min_len)
  hi = hi if max_len is None else int(max_len)
  if not 1 <= lo <= hi:
    raise ValueError(f'need 1 <= min_len <= max_len, got ({lo}, {hi}).')
  if spec.odd_lengths_only and lo == hi and lo % 2 == 0:
    raise ValueError(
      f'{spec.name} expressions have odd length; min_len = max_len = {lo} '
      'has no odd length. Use an odd length or a wider range.'
    )
  return lo, hi


def split_rng(task: str, split: str, seed: int) -> np.random.Generator:
  """The numpy Generator used for (task, split, seed)."""
  task_spec(task)
  if split not in SPLITS:
    raise ValueError(f'unknown split {split!r}; choose one of {SPLITS}.')
  ss = np.random.SeedSequence(
    [seed, zlib.crc32(task.encode()), _SPLIT_IDS[split]]
  )
  return np.random.default_rng(ss)


def make_split(
  task: str,
  split: str,
  num_examples: int,
  *,
  seed: int,
  min_len: int | None = None,
  max_len: int | None = None,
  num_generators: int | None = None,
  generator_seed: int = 0,
  prefix_labels: bool = False,
) -> dict[str, np.ndarray]:
  """Generates one split of a task, deterministically from ``seed``.

  Args:
    task: a key of ``TASKS``.
    split: 'train', 'validation' or 'test' (selects the seed stream and the
      default lengths in ``DEFAULT_LENGTHS``).
    num_examples: number of sequences.
    seed: base seed.
    min_len: shortest sequence (default per split).
    max_len: longest sequence and padded width (default per split).
    num_generators: group tasks only; None = every element is a token.
    generator_seed: group tasks only; picks the random generator set.
    prefix_labels: group tasks only; also return ``prefix_labels`` int32
      [num, max_len], the product of every prefix (0 on padding). Drawing
      it does not change the other arrays.

  Returns:
    dict with ``tokens`` int32 [num, max_len] (right-padded with PAD_ID),
    ``lengths`` int32 [num] and ``labels`` int32 [num].
  """
  spec = task_spec(task)
  _check_group_kwargs(spec, num_generators, prefix_labels)
  if num_examples < 1:
    raise ValueError(f'num_examples must be >= 1, got {num_examples}.')
  lo, hi = _resolve_lengths(spec, split, min_len, max_len)
  return _generate(
    spec,
    split_rng(task, split, seed),
    num_examples,
    lo,
    hi,
    hi,
    num_generators,
    generator_seed,
    prefix_labels,
  )


def make_splits(
  task: str,
  *,
  seed: int,
  num_train: int,
  num_validation: int,
  num_test: int,
  lengths: dict[str, tuple[int, int]] | None = None,
  num_generators: int | None = None,
  generator_seed: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
  """All three splits of a task; ``lengths`` overrides DEFAULT_LENGTHS."""
  lengths = {**DEFAULT_LENGTHS, **(lengths or {})}
  sizes = {'train': num_train, 'validation': num_validation, 'test': num_test}
  return {
    split: make_split(
      task,
      split,
      sizes[split],
      seed=seed,
      min_len=lengths[split][0],
      max_len=lengths[split][1],
      num_generators=num_generators,
      generator_seed=generator_seed,
    )
    for split in SPLITS
  }


def iterate_batches(
  data: dict[str, np.ndarray],
  batch_size: int,
  *,
  seed: int | None = 0,
  num_epochs: int | None = 1,
  drop_remainder: bool = True,
) -> Iterator[dict[str, np.ndarray]]:
  """Yields batches of a split; shuffled each epoch unless ``seed`` is None.

  Args:
    data: output of ``make_split``.
    batch_size: examples per batch.
    seed: shuffle seed (epoch e uses SeedSequence([seed, e])); None keeps the
      stored order.
    num_epochs: passes over the data; None = forever.
    drop_remainder: drop the last incomplete batch (keeps shapes static).
  """
  num = len(data['labels'])
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}.')
  if drop_remainder and batch_size > num:
    raise ValueError(
      f'batch_size={batch_size} > {num} examples with drop_remainder=True '
      'yields nothing; lower batch_size or set drop_remainder=False.'
    )
  epoch = 0
  while num_epochs is None or epoch < num_epochs:
    if seed is None:
      order = np.arange(num)
    else:
      order = np.random.default_rng([seed, epoch]).permutation(num)
    stop = num - num % batch_size if drop_remainder else num
    for start in range(0, stop, batch_size):
      idx = order[start : start + batch_size]
      yield {k: v[idx] for k, v in data.items()}
    epoch += 1


def stream_batches(
  task: str,
  batch_size: int,
  *,
  seed: int,
  min_len: int | None = None,
  max_len: int | None = None,
  num_generators: int | None = None,
  generator_seed: int = 0,
  prefix_labels: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
  """Endless fresh training batches (train-split stream of ``seed``)."""
  spec = task_spec(task)
  _check_group_kwargs(spec, num_generators, prefix_labels)
  lo, hi = _resolve_lengths(spec, 'train', min_len, max_len)
  rng = split_rng(task, 'train', seed)
  while True:
    yield _generate(
      spec,
      rng,
      batch_size,
      lo,
      hi,
      hi,
      num_generators,
      generator_seed,
      prefix_labels,
    )


def curriculum_max_len(step: int, lo: int, hi: int, ramp_steps: int) -> int:
  """Longest word at ``step`` of a length curriculum: lo -> hi linearly.

  The first batch has words of length ``lo`` only; from ``ramp_steps`` on
  the whole range [lo, hi] is used (``ramp_steps`` = 0: no curriculum).
  """
  if ramp_steps <= 0 or step >= ramp_steps:
    return hi
  return lo + int((hi - lo) * step / ramp_steps)


def curriculum_batches(
  task: str,
  batch_size: int,
  *,
  seed: int,
  ramp_steps: int,
  start: int = 0,
  min_len: int | None = None,
  max_len: int | None = None,
  num_generators: int | None = None,
  generator_seed: int = 0,
  prefix_labels: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
  """Endless training batches, short words first (a length curriculum).

  Batch i has lengths in [lo, ``curriculum_max_len(i, ...)``], padded to
  the final max_len so every batch has one shape (one compiled step).
  Batch i is drawn from its own stream (seed, task, 'train', i), so a
  resumed run starts at ``start`` without replaying the earlier batches.
  """
  spec = task_spec(task)
  _check_group_kwargs(spec, num_generators, prefix_labels)
  lo, hi = _resolve_lengths(spec, 'train', min_len, max_len)
  for step in itertools.count(start):
    ss = np.random.SeedSequence(
      [seed, zlib.crc32(task.encode()), _SPLIT_IDS['train'], step + 1]
    )
    cur_hi = max(lo, curriculum_max_len(step, lo, hi, ramp_steps))
    if spec.odd_lengths_only:
      cur_hi = max(cur_hi - (cur_hi % 2 == 0), lo + (lo % 2 == 0))
    yield _generate(
      spec,
      np.random.default_rng(ss),
      batch_size,
      lo,
      cur_hi,
      hi,
      num_generators,
      generator_seed,
      prefix_labels,
    )
