"""How close a PD-SSM's hardened token maps are to a group representation.

A one-layer PD-SSM tracks a finite group exactly when the column one-hot
P of every group-element token permutes the states reachable from h_0 and
the maps compose like the group: map(a) then map(b) equals map(a * b).
Accuracy alone cannot tell a run that is building such a representation
from one that memorises the last few tokens; these two numbers can:

- ``bijective_frac``: the fraction of token maps that are bijections on
  the orbit (the states reachable from the start states under all maps).
- ``homomorphism_frac``: the fraction of token pairs (a, b) whose composed
  map equals the map of c = a * b on the orbit (the multiplication table
  is the group's full set of defining relations).
- ``distinct_maps``: how many different maps the tokens induce on the
  orbit. The trivial representation (every map the identity) satisfies
  every relation; a faithful one, which the task needs, has one distinct
  map per element (per generator when the tokens are generators).
- ``block_*``: the same three numbers on the best block, the orbit of a
  single state that the maps keep to themselves (most relations satisfied,
  then most distinct maps, then fewest states). A layer can carry the
  group on states that h_0 never reaches, written by the input (e.g. S3
  permuting three states whose values the input makes distinct): the
  orbit of h_0 misses that representation, a block does not.

Convention (that of ``ddlm_jax.models.ssm``): a map is the column argmax
``p_xN`` of P, so the state j moves to ``p[j]``; a word is applied left to
right, so "a then b" sends j to ``p_b[p_a[j]]``. Group tables follow
``ddlm_jax.data.state_tracking.group_table``: ``table[a, b]`` is a * b with
a applied first. Everything here is numpy on a few small integer arrays.
"""

from __future__ import annotations

import numpy as np


def orbit(maps_GxN: np.ndarray, start) -> np.ndarray:
  """Sorted states reachable from ``start`` (ints) under the maps (BFS)."""
  maps = np.asarray(maps_GxN)
  seen = {int(s) for s in start}
  frontier = sorted(seen)
  while frontier:
    nxt = {int(v) for v in maps[:, frontier].ravel()} - seen
    seen |= nxt
    frontier = sorted(nxt)
  return np.array(sorted(seen), np.int64)


def _distinct(maps_GxN: np.ndarray, states: np.ndarray) -> int:
  """Number of different maps restricted to ``states``."""
  return len({tuple(row) for row in np.asarray(maps_GxN)[:, states].tolist()})


def bijective_on(maps_GxN: np.ndarray, states: np.ndarray) -> np.ndarray:
  """bool_G: does each map send ``states`` onto ``states`` one to one?"""
  img_GxS = np.asarray(maps_GxN)[:, states]
  ok = [
    len(set(row.tolist())) == len(states) and set(row.tolist()) <= set(states)
    for row in img_GxS
  ]
  return np.array(ok, bool)


def homomorphism_hits(
  maps_GxN: np.ndarray, table_GxG: np.ndarray, states: np.ndarray
) -> np.ndarray:
  """bool_GxG: map(a) then map(b) equals map(a * b) on ``states``."""
  maps = np.asarray(maps_GxN)
  table = np.asarray(table_GxG)
  g = maps.shape[0]
  if table.shape != (g, g):
    raise ValueError(
      f'table_GxG must be ({g}, {g}) for {g} maps, got {table.shape}.'
    )
  on_S = maps[:, states]  # first map applied to the states, [G, S]
  # then_GxGxS[a, b, s] = p_b[p_a[s]].
  then_GxGxS = maps[np.arange(g)[None, :, None], on_S[:, None, :]]
  want_GxGxS = on_S[table]
  return (then_GxGxS == want_GxGxS).all(-1)


def group_map_scores(
  maps_GxN: np.ndarray, table_GxG: np.ndarray, start=(0,)
) -> dict:
  """The diagnostic of learned token maps against a group's table.

  Args:
    maps_GxN: ``maps[a]`` is the column argmax of P for the token of group
      element a (rows in the order of the table's elements).
    table_GxG: the group's multiplication table (a applied first).
    start: the states h_0 occupies (``(0,)`` for h_0 = e_0; every state
      for h_0 = 0, where the input writes into all of them).

  Returns:
    {'bijective_frac', 'homomorphism_frac', 'orbit_size', 'distinct_maps',
    'distinct_elements'} on the orbit of ``start`` and the same, prefixed
    'block_', on the best closed block of states. The tokens are the
    elements here, so distinct_elements is distinct_maps; a faithful action
    has |G| of them.
  """
  maps = np.asarray(maps_GxN)
  if maps.ndim != 2 or not np.issubdtype(maps.dtype, np.integer):
    raise ValueError(
      f'maps_GxN must be a 2-D integer array, got {maps.dtype} {maps.shape}.'
    )

  def scores(states):
    distinct = _distinct(maps, states)
    return {
      'bijective_frac': float(bijective_on(maps, states).mean()),
      'homomorphism_frac': float(
        homomorphism_hits(maps, table_GxG, states).mean()
      ),
      'orbit_size': int(len(states)),
      'distinct_maps': distinct,
      'distinct_elements': distinct,
    }

  return {**scores(orbit(maps, start)), **_best_block(maps, scores)}


def generator_map_scores(
  gen_maps_KxN: np.ndarray,
  gens_K: np.ndarray,
  table_GxG: np.ndarray,
  identity: int,
  start=(0,),
) -> dict:
  """The diagnostic when the tokens are k generators, not every element.

  Each element g gets the map of its shortest word (breadth first from the
  identity, whose map is the identity); the relations are then the
  Cayley-graph edges g -> g * s that this spanning tree does not already
  use: map(g) then map(s) must equal map(g * s). ``bijective_frac`` and
  ``distinct_maps`` are over the k token maps and the orbit is theirs, as
  in ``group_map_scores``; ``distinct_elements`` counts the elements'
  maps (|G| where the action is faithful).
  """
  maps = np.asarray(gen_maps_KxN)
  gens = [int(g) for g in gens_K]
  table = np.asarray(table_GxG)
  if maps.ndim != 2 or maps.shape[0] != len(gens):
    raise ValueError(
      f'gen_maps_KxN must be [{len(gens)}, N] (one row per generator), '
      f'got {maps.shape}.'
    )
  elem = {int(identity): np.arange(maps.shape[1])}
  tree, frontier = set(), [int(identity)]
  while frontier:
    nxt = []
    for g in frontier:
      for k, s in enumerate(gens):
        h = int(table[g, s])
        if h not in elem:
          elem[h] = maps[k][elem[g]]
          tree.add((g, k))
          nxt.append(h)
    frontier = nxt
  element_maps = np.stack([elem[g] for g in sorted(elem)])

  def scores(states):
    hits = [
      bool((maps[k][elem[g][states]] == elem[int(table[g, s])][states]).all())
      for g in elem
      for k, s in enumerate(gens)
      if (g, k) not in tree
    ]
    return {
      'bijective_frac': float(bijective_on(maps, states).mean()),
      'homomorphism_frac': float(np.mean(hits)) if hits else 1.0,
      'orbit_size': int(len(states)),
      'distinct_maps': _distinct(maps, states),
      'distinct_elements': _distinct(element_maps, states),
    }

  return {**scores(orbit(maps, start)), **_best_block(maps, scores)}


def _best_block(maps_GxN: np.ndarray, scores) -> dict:
  """``block_*`` scores of the best closed orbit of one state.

  ``scores(states)`` is the scorer of the caller; only orbits that every
  map keeps inside (the maps restricted to them are bijections) count.
  """
  maps = np.asarray(maps_GxN)
  blocks = {tuple(orbit(maps, (s,)).tolist()) for s in range(maps.shape[1])}
  best, key = None, None
  for block in sorted(blocks):
    states = np.array(block, np.int64)
    if not bijective_on(maps, states).all():
      continue
    got = scores(states)
    rank = (
      got['homomorphism_frac'],
      got['distinct_elements'],
      got['distinct_maps'],
      -len(block),
    )
    if key is None or rank > key:
      best, key = got, rank
  if best is None:  # No map keeps any orbit (none is a bijection).
    return {
      'block_size': 0,
      'block_homomorphism_frac': 0.0,
      'block_distinct_maps': 0,
      'block_distinct_elements': 0,
    }
  return {
    'block_size': best['orbit_size'],
    'block_homomorphism_frac': best['homomorphism_frac'],
    'block_distinct_maps': best['distinct_maps'],
    'block_distinct_elements': best['distinct_elements'],
  }


def regular_representation(table_GxG: np.ndarray) -> np.ndarray:
  """maps_GxG of the right regular action: state x goes to x * a.

  With state = element index and h_0 = the identity, the running product
  is the state, so these maps score 1.0 on both fractions (tests, docs).
  """
  table = np.asarray(table_GxG)
  return np.ascontiguousarray(table.T)
