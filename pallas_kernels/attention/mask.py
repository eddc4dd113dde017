"""Attention masks as descriptions (``MaskSpec``) plus their tile tables.

A mask says whether query position i (in [0, L)) may attend to key position
j (in [0, S)); positions index the query and key sequences directly (no
offset between them). Kinds:

- ``full``: every key, optionally restricted to valid keys (padding).
- ``causal``: j <= i.
- ``block_causal(bs)``: j // bs <= i // bs (own block both ways, all earlier
  blocks).
- ``prefix_lm(P)``: j < P or j <= i.
- ``block_diffusion(bs, n)``: BD3-LM's vectorised training mask over the 2n
  positions of concat(z_t, x). Position p is clean iff p >= n and lies in
  block (p mod n) // bs; a noisy query sees its own noisy block and the
  clean blocks before it, a clean query sees the clean blocks up to its own
  (block-causal), and no query sees another block's noisy tokens.
- ``segments(ids)``: same segment id (packed sequences).
- ``groups(ids, visible)``: group-level visibility. Every token has a group
  id in [0, G) (G <= 32) and query i sees key j iff
  ``visible[b, group_q[i], group_k[j]]``. This covers segments (identity),
  block-causal (lower triangle), "prompt visible to all, answers private"
  and similar layouts. Inside kernels the row ``visible[b, group_q[i], :]``
  is packed into an int32 bit mask, so the test is a shift and an and.

Any kind can additionally carry key padding (``with_kv_valid``).

Masks are never materialised by the kernels. ``tile_table`` classifies each
(query block, key block) tile as EMPTY (skipped: no compute, and its key
block is not fetched), PARTIAL (mask evaluated in-kernel) or FULL (mask
skipped). Static kinds get an exact table on the host in NumPy from closed
forms per tile. Data-dependent parts (segments, groups, padding) are refined
at runtime in XLA from per-tile reductions (min/max of segment ids, or/and of
group bit masks, counts of valid keys); these refinements are sound (EMPTY
and FULL are never wrong) and exact for contiguous segments.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

EMPTY, PARTIAL, FULL = 0, 1, 2
MAX_GROUPS = 32
STATIC_KINDS = (
  'full',
  'causal',
  'block_causal',
  'prefix_lm',
  'block_diffusion',
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MaskSpec:
  """Description of an attention mask; build it with the constructors."""

  kind: str = dataclasses.field(metadata=dict(static=True))
  block_size: int = dataclasses.field(default=0, metadata=dict(static=True))
  prefix_len: int = dataclasses.field(default=0, metadata=dict(static=True))
  kv_valid_BxS: jax.Array | None = None  # noqa: N815
  q_ids_BxL: jax.Array | None = None  # noqa: N815
  kv_ids_BxS: jax.Array | None = None  # noqa: N815
  visible_BxGxG: jax.Array | None = None  # noqa: N815
  seq_len: int = dataclasses.field(default=0, metadata=dict(static=True))

  # ---------------------------------------------------------- constructors --

  @classmethod
  def full(cls, kv_valid_BxS: jax.Array | None = None) -> MaskSpec:
    """Bidirectional attention, optionally over valid keys only."""
    return cls('full', kv_valid_BxS=_as_valid(kv_valid_BxS))

  @classmethod
  def causal(cls) -> MaskSpec:
    return cls('causal')

  @classmethod
  def block_causal(cls, block_size: int) -> MaskSpec:
    if not isinstance(block_size, int) or block_size < 1:
      raise ValueError(f'block_size must be an int >= 1, got {block_size!r}.')
    return cls('block_causal', block_size=block_size)

  @classmethod
  def prefix_lm(cls, prefix_len: int) -> MaskSpec:
    if not isinstance(prefix_len, int) or prefix_len < 0:
      raise ValueError(f'prefix_len must be an int >= 0, got {prefix_len!r}.')
    return cls('prefix_lm', prefix_len=prefix_len)

  @classmethod
  def block_diffusion(cls, block_size: int, seq_len: int) -> MaskSpec:
    """BD3-LM's mask over concat(z_t, x): 2 * seq_len queries and keys."""
    for name, value in (('block_size', block_size), ('seq_len', seq_len)):
      if not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f'{name} must be an int >= 1, got {value!r}.')
    if seq_len % block_size:
      raise ValueError(
        f'block_size={block_size} does not divide seq_len={seq_len}; '
        'choose a block size that divides the length.'
      )
    return cls(
      'block_diffusion', block_size=int(block_size), seq_len=int(seq_len)
    )

  @classmethod
  def segments(
    cls,
    segment_ids_BxL: jax.Array,
    kv_segment_ids_BxS: jax.Array | None = None,
  ) -> MaskSpec:
    """Packed sequences: attend within the same segment id only."""
    q = _as_ids('segment_ids_BxL', segment_ids_BxL)
    kv = q if kv_segment_ids_BxS is None else kv_segment_ids_BxS
    kv = _as_ids('kv_segment_ids_BxS', kv)
    return cls('segments', q_ids_BxL=q, kv_ids_BxS=kv)

  @classmethod
  def groups(
    cls,
    group_ids_BxL: jax.Array,
    visible_BxGxG: jax.Array,
    kv_group_ids_BxS: jax.Array | None = None,
  ) -> MaskSpec:
    """Group visibility: i sees j iff visible[b, group[i], group[j]].

    Group ids must lie in [0, G) with G = visible.shape[-1] <= 32; ids out
    of range see nothing and are seen by nobody.
    """
    q = _as_ids('group_ids_BxL', group_ids_BxL)
    kv = q if kv_group_ids_BxS is None else kv_group_ids_BxS
    kv = _as_ids('kv_group_ids_BxS', kv)
    vis = jnp.asarray(visible_BxGxG)
    if vis.ndim != 3 or vis.shape[1] != vis.shape[2]:
      raise ValueError(
        f'visible_BxGxG must have shape (B, G, G), got {vis.shape}.'
      )
    if vis.shape[-1] > MAX_GROUPS:
      raise ValueError(
        f'groups supports at most {MAX_GROUPS} groups (bit masks), got '
        f'G={vis.shape[-1]}.'
      )
    return cls('groups', q_ids_BxL=q, kv_ids_BxS=kv, visible_BxGxG=vis)

  def with_kv_valid(self, kv_valid_BxS: jax.Array) -> MaskSpec:
    """Adds key padding (True = real key) to any mask kind."""
    return dataclasses.replace(self, kv_valid_BxS=_as_valid(kv_valid_BxS))

  # ----------------------------------------------------------------- checks --

  def validate(self, B: int, L: int, S: int) -> None:
    """Raises ValueError if the mask does not fit (B, L, S)."""
    if self.kind not in STATIC_KINDS + ('segments', 'groups'):
      raise ValueError(f'unknown mask kind {self.kind!r}.')
    checks = [('kv_valid_BxS', self.kv_valid_BxS, (B, S))]
    if self.kind in ('segments', 'groups'):
      checks += [
        ('query ids', self.q_ids_BxL, (B, L)),
        ('key ids', self.kv_ids_BxS, (B, S)),
      ]
    if self.kind == 'groups':
      G = self.visible_BxGxG.shape[-1]
      checks.append(('visible_BxGxG', self.visible_BxGxG, (B, G, G)))
    if self.kind == 'block_diffusion' and not L == S == 2 * self.seq_len:
      raise ValueError(
        f'block_diffusion(seq_len={self.seq_len}) covers concat(z_t, x) of '
        f'{2 * self.seq_len} positions; got L={L} queries and S={S} keys.'
      )
    for name, x, shape in checks:
      if x is not None and tuple(x.shape) != shape:
        raise ValueError(
          f'mask {name} has shape {tuple(x.shape)}, expected {shape} for '
          f'B={B}, L={L}, S={S} (pass per-key arrays for the key sequence).'
        )

  @property
  def is_static(self) -> bool:
    return self.kind in STATIC_KINDS and self.kv_valid_BxS is None

  # ------------------------------------------------------------- dense form --

  def dense(self, B: int, L: int, S: int) -> jax.Array:
    """The (B, L, S) boolean mask (for the reference and for tests)."""
    if self.kind in STATIC_KINDS:
      m = jnp.broadcast_to(
        jnp.asarray(static_allowed(self, np.arange(L)[:, None], np.arange(S))),
        (B, L, S),
      )
    elif self.kind == 'segments':
      m = self.q_ids_BxL[:, :, None] == self.kv_ids_BxS[:, None, :]
    else:
      bits = self.query_bits()
      m = ((bits[:, :, None] >> self.kv_ids_BxS[:, None, :]) & 1) == 1
      G = self.visible_BxGxG.shape[-1]
      kv_in = (self.kv_ids_BxS >= 0) & (self.kv_ids_BxS < G)
      m = m & kv_in[:, None, :]
    if self.kv_valid_BxS is not None:
      m = m & self.kv_valid_BxS[:, None, :]
    return m

  def query_bits(self) -> jax.Array:
    """(B, L) int32: bit g set iff the query's group sees group g."""
    vis = self.visible_BxGxG.astype(jnp.int32)
    G = vis.shape[-1]
    weights = jnp.left_shift(jnp.int32(1), jnp.arange(G, dtype=jnp.int32))
    row_bits = jnp.sum(vis * weights, axis=-1, dtype=jnp.int32)  # (B, G)
    ids = self.q_ids_BxL
    safe = jnp.clip(ids, 0, G - 1)
    bits = jnp.take_along_axis(row_bits, safe, axis=1)
    return jnp.where((ids >= 0) & (ids < G), bits, 0)


def _as_valid(x):
  if x is None:
    return None
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'kv_valid_BxS must have shape (B, S), got {x.shape}.')
  return x.astype(bool)


def _as_ids(name, x):
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'{name} must have shape (B, L), got {x.shape}.')
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f'{name} must be integer, got {x.dtype}.')
  return x.astype(jnp.int32)


def _nonneg_div(x, n: int):
  """x // n for x >= 0; lax.div on traced values (lowers in Mosaic, where
  jnp's floor division needs ``sign``)."""
  if isinstance(x, np.ndarray | int | np.integer):
    return x // n
  return jax.lax.div(x, jnp.int32(n))


def static_allowed(spec: MaskSpec, q, k):
  """Elementwise rule of a static kind; works on NumPy or jnp positions."""
  if spec.kind == 'full':
    return (q >= 0) | (k >= 0)  # all True, broadcast
  if spec.kind == 'causal':
    return k <= q
  if spec.kind == 'block_causal':
    bs = spec.block_size
    return _nonneg_div(k, bs) <= _nonneg_div(q, bs)
  if spec.kind == 'prefix_lm':
    return (k < spec.prefix_len) | (k <= q)
  if spec.kind == 'block_diffusion':
    n, bs = spec.seq_len, spec.block_size
    clean_q, clean_k = q >= n, k >= n
    block_q = _nonneg_div(_where(clean_q, q - n, q), bs)
    block_k = _nonneg_div(_where(clean_k, k - n, k), bs)
    # The three rules of BD3-LM with the clean block-diagonal folded into the
    # clean block-causal rule (written without bool ==, for Mosaic).
    noisy_own = ~clean_q & ~clean_k & (block_q == block_k)
    noisy_ctx = ~clean_q & clean_k & (block_q > block_k)
    clean_ctx = clean_q & clean_k & (block_q >= block_k)
    return noisy_own | noisy_ctx | clean_ctx
  raise ValueError(f'{spec.kind!r} is not a static mask kind.')


def _where(c, x, y):
  if isinstance(c, np.ndarray | bool | np.bool_):
    return np.where(c, x, y)
  return jnp.where(c, x, y)


# --------------------------------------------------------------- tile tables --


def static_tile_table(
  spec: MaskSpec, L: int, S: int, bq: int, bk: int
) -> np.ndarray:
  """(nq, nk) int32 host table of EMPTY / PARTIAL / FULL for a static kind.

  Closed forms per tile from the tile's corner positions (the static rules
  are monotone in j and in i). Keys at positions >= S (block padding) make a
  tile at most PARTIAL; query rows >= L are ignored.
  """
  nq, nk = -(-L // bq), -(-S // bk)
  qlo = np.arange(nq)[:, None] * bq
  qhi = np.minimum(qlo + bq, L) - 1
  klo = np.arange(nk)[None, :] * bk
  khi_pad = klo + bk - 1
  khi = np.minimum(khi_pad, S - 1)
  if spec.kind == 'full':
    full = np.ones((nq, nk), bool)
    empty = np.zeros((nq, nk), bool)
  elif spec.kind == 'causal':
    full = khi <= qlo
    empty = klo > qhi
  elif spec.kind == 'block_causal':
    bs = spec.block_size
    full = khi // bs <= qlo // bs
    empty = klo // bs > qhi // bs
  elif spec.kind == 'prefix_lm':
    P = spec.prefix_len
    full = khi <= np.maximum(P - 1, qlo)
    empty = (klo >= P) & (klo > qhi)
  elif spec.kind == 'block_diffusion':
    full, empty = _block_diffusion_tiles(spec, qlo, qhi, klo, khi)
  else:
    raise ValueError(f'{spec.kind!r} has no static tile table.')
  full = full & (khi_pad < S)
  table = np.where(empty, EMPTY, np.where(full, FULL, PARTIAL))
  return table.astype(np.int32)


def _halves(lo, hi, n, bs):
  """Block ranges of a position range [lo, hi] in the noisy and clean halves.

  Returns ((noisy?, first, last), (clean?, first, last)); the block indices
  of a contiguous position range form a contiguous range.
  """
  noisy = (lo < n, lo // bs, np.minimum(hi, n - 1) // bs)
  clean = (hi >= n, (np.maximum(lo, n) - n) // bs, (hi - n) // bs)
  return noisy, clean


def _block_diffusion_tiles(spec, qlo, qhi, klo, khi):
  """(full, empty) per tile of the block-diffusion mask, exactly.

  A tile splits into at most 2 x 2 (query half, key half) parts; inside a
  part the rule is one comparison of block indices over two intervals.
  """
  n, bs = spec.seq_len, spec.block_size
  q_noisy, q_clean = _halves(qlo, qhi, n, bs)
  k_noisy, k_clean = _halves(klo, khi, n, bs)
  # (query half, key half, any pair allowed, every pair allowed).
  parts = [
    (q_noisy, k_noisy, lambda a1, a2, c1, c2: (a1 <= c2) & (c1 <= a2),
     lambda a1, a2, c1, c2: (a1 == a2) & (c1 == c2) & (a1 == c1)),
    (q_noisy, k_clean, lambda a1, a2, c1, c2: a2 > c1,
     lambda a1, a2, c1, c2: a1 > c2),
    (q_clean, k_noisy, lambda *_: False, lambda *_: False),
    (q_clean, k_clean, lambda a1, a2, c1, c2: a2 >= c1,
     lambda a1, a2, c1, c2: a1 >= c2),
  ]  # fmt: skip
  shape = np.broadcast_shapes(qlo.shape, klo.shape)
  some, every = np.zeros(shape, bool), np.ones(shape, bool)
  for (q_in, a1, a2), (k_in, c1, c2), any_fn, all_fn in parts:
    present = q_in & k_in
    some |= present & any_fn(a1, a2, c1, c2)
    every &= ~present | all_fn(a1, a2, c1, c2)
  return every, ~some


def _tile_reduce(x, n, b, fn, fill):
  """Reduces (B, T) to (B, n) tiles of size b with fn; pads with fill."""
  B, T = x.shape
  x = jnp.pad(x, ((0, 0), (0, n * b - T)), constant_values=fill)
  return fn(x.reshape(B, n, b), axis=-1)


def _or_reduce(x, axis):
  return jax.lax.reduce(x, np.int32(0), jax.lax.bitwise_or, (axis % x.ndim,))


def _and_reduce(x, axis):
  return jax.lax.reduce(x, np.int32(-1), jax.lax.bitwise_and, (axis % x.ndim,))


def tile_table(
  spec: MaskSpec, B: int, L: int, S: int, bq: int, bk: int
) -> jax.Array | np.ndarray:
  """Tile table: NumPy (1, nq, nk) if static, else a jnp (B, nq, nk) array."""
  nq, nk = -(-L // bq), -(-S // bk)
  base = spec if spec.kind in STATIC_KINDS else MaskSpec('full')
  table = static_tile_table(base, L, S, bq, bk)[None]
  if spec.is_static:
    return table
  dyn = jnp.full((B, nq, nk), FULL, jnp.int32)
  big = np.int32(2**30)
  if spec.kind == 'segments':
    qmin = _tile_reduce(spec.q_ids_BxL, nq, bq, jnp.min, big)
    qmax = _tile_reduce(spec.q_ids_BxL, nq, bq, jnp.max, -big)
    # Padded keys must not widen the key range: use the tile's own ids.
    kids = spec.kv_ids_BxS
    kmin = _tile_reduce(kids, nk, bk, jnp.min, big)
    kmax = _tile_reduce(kids, nk, bk, jnp.max, -big)
    qmin, qmax = qmin[:, :, None], qmax[:, :, None]
    kmin, kmax = kmin[:, None, :], kmax[:, None, :]
    empty = (qmax < kmin) | (kmax < qmin)
    full = (qmin == qmax) & (kmin == kmax) & (qmin == kmin)
    dyn = jnp.where(empty, EMPTY, jnp.where(full, FULL, PARTIAL))
  elif spec.kind == 'groups':
    G = spec.visible_BxGxG.shape[-1]
    bits = spec.query_bits()
    kid = spec.kv_ids_BxS
    kbit = jnp.where(
      (kid >= 0) & (kid < G), jnp.left_shift(1, jnp.clip(kid, 0, 31)), 0
    ).astype(jnp.int32)
    q_or = _tile_reduce(bits, nq, bq, _or_reduce, 0)[:, :, None]
    q_and = _tile_reduce(bits, nq, bq, _and_reduce, -1)[:, :, None]
    k_or = _tile_reduce(kbit, nk, bk, _or_reduce, 0)[:, None, :]
    kin = (kid >= 0) & (kid < G)
    k_all = _tile_reduce(kin, nk, bk, jnp.all, True)[:, None, :]
    empty = (q_or & k_or) == 0
    full = ((q_and & k_or) == k_or) & k_all
    dyn = jnp.where(empty, EMPTY, jnp.where(full, FULL, PARTIAL))
  if spec.kv_valid_BxS is not None:
    valid = spec.kv_valid_BxS
    any_v = _tile_reduce(valid, nk, bk, jnp.any, False)[:, None, :]
    all_v = _tile_reduce(valid, nk, bk, jnp.all, True)[:, None, :]
    pad = jnp.where(any_v, jnp.where(all_v, FULL, PARTIAL), EMPTY)
    dyn = jnp.minimum(dyn, pad)
  return jnp.minimum(dyn, jnp.asarray(table)).astype(jnp.int32)


def fetch_table(table):
  """Block index to fetch per tile: itself, or a neighbour for EMPTY tiles.

  An EMPTY tile re-uses the last non-empty block of its row (or the row's
  first non-empty block), so the pipeline sees an unchanged block index and
  issues no copy. Works on (Bt, n_outer, n_inner) NumPy or jnp tables.
  """
  xp = np if isinstance(table, np.ndarray) else jnp
  n = table.shape[-1]
  idx = xp.arange(n, dtype=np.int32)
  nonempty = table != EMPTY
  last = xp.where(nonempty, idx, -1)
  last = (
    np.maximum.accumulate(last, axis=-1)
    if xp is np
    else jax.lax.cummax(last, axis=last.ndim - 1)
  )
  first = xp.argmax(nonempty, axis=-1)[..., None].astype(np.int32)
  return xp.where(last < 0, first, last).astype(np.int32)
