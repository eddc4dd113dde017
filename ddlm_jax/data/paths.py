"""Shortest paths in small random graphs: a look-ahead planning task.

A teacher-forced ARM must commit to the first hop before it has found the
path, the look-ahead step it learns poorly (Bachmann & Nagarajan 2024); a
planner that writes the whole path at once has no such order. A problem of
level k is an undirected graph on NODES = 10 nodes with NUM_EDGES = 10 edges
whose shortest path from source to target is unique and has k hops:

  question  u1 v1 u2 v2 ... uE vE : s t     (edges in random order)
  plan      s n1 ... t                      (the path's k + 1 nodes)
  answer    n1, the first hop after the source

The source has at least two neighbours (else the answer is its only edge).
Levels 1-5 are the hop counts; level 5 is the held-out one.

Generator: a random simple path of k hops, then distractor edges tried in
random order, each kept only while (A^j)[s, t] = 0 for j < k and
(A^k)[s, t] = 1 (walk counts of the adjacency matrix: no shorter walk and
exactly one k-hop walk, which is then the path). Verifier: breadth-first
search from the source with shortest-path counting on an edge list parsed
from the tokens; it shares no code with the generator. Splits are disjoint
by a hash of the sorted edges and the endpoints (data/planning_tasks.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

NODES = 10
NUM_EDGES = 10
MIN_SOURCE_DEGREE = 2  # else the first hop is the source's only edge
NODE_TOKENS = tuple(str(n) for n in range(NODES))
VOCAB = NODE_TOKENS + (':', '|', '=', '<pad>')
VOCAB_SIZE = len(VOCAB)
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}
COLON_ID = TOKEN_ID[':']
BAR_ID = TOKEN_ID['|']
EQ_ID = TOKEN_ID['=']
PAD_ID = TOKEN_ID['<pad>']
LEVELS = (1, 2, 3, 4, 5)
TRAIN_LEVELS = (1, 2, 3, 4)
HELDOUT_LEVEL = 5
QUESTION_LEN = 2 * NUM_EDGES + 3
PLAN_LEN = max(LEVELS) + 1


def plan_tokens_needed(level: int) -> int:
  return level + 1


# ------------------------------------------------------------- generator


_PAIRS = np.asarray([(u, v) for u in range(NODES) for v in range(u + 1, NODES)])


def _unique_shortest(adj_NxVxV, s_N, t_N, hops: int) -> np.ndarray:
  """Per graph: (A^j)[s, t] = 0 for j < hops and (A^hops)[s, t] = 1."""
  rows = np.arange(len(s_N))
  walks = adj_NxVxV[rows, s_N][:, None]  # walks of length 1 from s
  ok = np.ones(len(s_N), bool)
  for _ in range(hops - 1):
    ok &= walks[rows, 0, t_N] == 0
    walks = walks @ adj_NxVxV
  return ok & (walks[rows, 0, t_N] == 1)


def _graphs(rng: np.random.Generator, num: int, hops: int):
  """(edges_NxEx2, path_NxK1): unique shortest paths of `hops` hops.

  Each graph is its path plus distractor edges tried in its own random
  order, an edge kept only while the shortest path stays unique and
  `hops` long; graphs short of NUM_EDGES edges start again.
  """
  edges_out = np.zeros((num, NUM_EDGES, 2), np.int64)
  path_out = np.zeros((num, hops + 1), np.int64)
  todo = np.arange(num)
  while len(todo):
    n = len(todo)
    rows = np.arange(n)
    path = np.argsort(rng.random((n, NODES)), axis=1)[:, : hops + 1]
    s_N, t_N = path[:, 0], path[:, -1]
    adj = np.zeros((n, NODES, NODES), np.int64)
    for a, b in zip(path.T, path[:, 1:].T):
      adj[rows, a, b] = adj[rows, b, a] = 1
    order = np.argsort(rng.random((n, len(_PAIRS))), axis=1)
    count = np.full(n, hops)
    for j in range(len(_PAIRS)):
      if np.all(count == NUM_EDGES):
        break
      u, v = _PAIRS[order[:, j]].T
      try_N = (count < NUM_EDGES) & (adj[rows, u, v] == 0)
      trial = adj.copy()
      trial[rows, u, v] = trial[rows, v, u] = 1
      keep = try_N & _unique_shortest(trial, s_N, t_N, hops)
      adj = np.where(keep[:, None, None], trial, adj)
      count = count + keep
    # The source needs a second neighbour, or the first hop is trivial.
    done = (count == NUM_EDGES) & (adj[rows, s_N].sum(1) >= MIN_SOURCE_DEGREE)
    for i in np.flatnonzero(done):
      iu, iv = np.nonzero(np.triu(adj[i]))
      e = np.stack([iu, iv], 1)[rng.permutation(NUM_EDGES)]
      flip = rng.random(NUM_EDGES) < 0.5
      e[flip] = e[flip][:, ::-1]
      edges_out[todo[i]] = e
    path_out[todo[done]] = path[done]
    todo = todo[~done]
  return edges_out, path_out


def generate(
  num: int, level: int, rng: np.random.Generator, plan_len: int
) -> dict[str, np.ndarray]:
  """`num` graphs of one level (planning_tasks keeps a split's share)."""
  if level not in LEVELS:
    raise ValueError(f'level={level}; choose one of {LEVELS}.')
  edges, path = _graphs(rng, num, level)
  question = np.zeros((num, QUESTION_LEN), np.int32)
  question[:, : 2 * NUM_EDGES] = edges.reshape(num, -1)
  question[:, 2 * NUM_EDGES] = COLON_ID
  question[:, -2], question[:, -1] = path[:, 0], path[:, -1]
  plan = np.full((num, plan_len), PAD_ID, np.int32)
  plan[:, : level + 1] = path
  return {
    'question': question,
    'plan': plan,
    'answer': path[:, 1].astype(np.int32),
    'level': np.full((num,), level, np.int32),
  }


def canonical(question_Q: np.ndarray) -> bytes:
  """Sorted undirected edges plus endpoints: what decides the split."""
  q = np.asarray(question_Q)
  edges = np.sort(q[: 2 * NUM_EDGES].reshape(-1, 2), axis=1)
  edges = edges[np.lexsort((edges[:, 1], edges[:, 0]))]
  return (
    np.concatenate([edges.reshape(-1), q[2 * NUM_EDGES :]])
    .astype(np.int8)
    .tobytes()
  )


# -------------------------------------------------------------- verifier


def parse_question(question_Q: Sequence[int]):
  """(neighbours dict, source, target) from question tokens."""
  toks = [int(t) for t in question_Q]
  if len(toks) != QUESTION_LEN or toks[2 * NUM_EDGES] != COLON_ID:
    raise ValueError('not a path question: expected edges, ":", s, t.')
  nbrs: dict[int, set[int]] = {n: set() for n in range(NODES)}
  for i in range(0, 2 * NUM_EDGES, 2):
    u, v = toks[i], toks[i + 1]
    nbrs[u].add(v)
    nbrs[v].add(u)
  return nbrs, toks[-2], toks[-1]


def shortest_paths(question_Q, limit: int = 2) -> list[list[int]]:
  """Up to `limit` shortest source -> target paths, by BFS with parents."""
  nbrs, s, t = parse_question(question_Q)
  dist, parents = {s: 0}, {s: []}
  queue = deque([s])
  while queue:
    u = queue.popleft()
    for v in sorted(nbrs[u]):
      if v not in dist:
        dist[v], parents[v] = dist[u] + 1, [u]
        queue.append(v)
      elif dist[v] == dist[u] + 1:
        parents[v].append(u)
  if t not in dist:
    return []
  out: list[list[int]] = []

  def back(node, suffix):
    if len(out) >= limit:
      return
    if node == s:
      out.append([s] + suffix)
      return
    for p in parents[node]:
      back(p, [node] + suffix)

  back(t, [])
  return out


def check_answers(question_BxQ, answer_B) -> np.ndarray:
  """Per problem: a unique shortest path whose first hop is the answer."""
  out = []
  for q, a in zip(np.asarray(question_BxQ), np.asarray(answer_B)):
    found = shortest_paths(q, 2)
    out.append(len(found) == 1 and len(found[0]) > 1 and found[0][1] == a)
  return np.asarray(out, bool)


def plan_correct(question_BxQ, plan_BxP) -> np.ndarray:
  """Per problem: the plan is a source -> target walk along edges whose
  length is the BFS distance (a shortest path), then PAD."""
  out = []
  for q, p in zip(np.asarray(question_BxQ), np.asarray(plan_BxP)):
    nbrs, s, t = parse_question(q)
    toks = [int(x) for x in p]
    n = toks.index(PAD_ID) if PAD_ID in toks else len(toks)
    path, tail = toks[:n], toks[n:]
    best = shortest_paths(q, 1)
    ok = (
      bool(best)
      and len(path) == len(best[0])
      and all(x < NODES for x in path)
      and path[0] == s
      and path[-1] == t
      and all(b in nbrs[a] for a, b in zip(path, path[1:]))
      and all(x == PAD_ID for x in tail)
    )
    out.append(ok)
  return np.asarray(out, bool)


def decode(tokens: Sequence[int]) -> str:
  return ' '.join(VOCAB[int(t)] for t in tokens if int(t) != PAD_ID)
