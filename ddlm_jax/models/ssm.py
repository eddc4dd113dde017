"""State-space sequence mixers: PD-SSM, complex/real diagonal SSMs, LSTM.

PD-SSM (arXiv 2509.22284) runs the recurrence
h_t = A_t h_{t-1} + B u_t in C^N with A_t = P_t D_t, read out as
y_t = Re(C h_t) + D_skip * u_t:

- P_t is column one-hot. A selection s_t = softmax(S u_t) mixes a dictionary
  of K dense real N x N matrices, M_t = sum_k s_k M_k; column j of M_t is
  hardened to the one-hot e_{argmax_i M_t[i, j]} in the forward pass, and the
  backward pass uses the gradient of the column-wise softmax of M_t
  (straight-through). The scan itself only sees the row indices
  ``p_idx[j] = argmax_i M_t[i, j]`` and costs O(N) per step
  (``pallas_kernels.pd_scan``); dense N x N products appear only where the
  paper has them (building M_t, and the straight-through gradient of P_t).
- Training aids, both off by default: ``dict_init='permutation'``
  (``permutation_dictionary``: every token's hardened P starts as a
  bijection) and ``relax_temperature`` (train through the dense Sinkhorn
  relaxation of P_t, ``dense_scan``; evaluation keeps the hardmax; with
  ``relax_hard`` the training forward is the hardmax layer itself and only
  the backward is relaxed; with ``relax_noise`` the relaxation is the
  Gumbel-Sinkhorn one, which samples permutations around M_t).
- D_t is complex diagonal: |D_t| = sigmoid(MLP_mag(u_t)) (clipped to
  ``max_magnitude`` < 1 so the system stays BIBO-stable in float32, where
  sigmoid saturates to exactly 1), phase = 2 pi sigmoid(MLP_phase(u_t)).

The same ``SSMMixer`` class also gives the paper's baselines through
``mode``: 'complex_diag' (P = I, same D_t, ``pallas_kernels.linear_scan``)
and 'selective_diag', a Mamba-like real diagonal SSM with input-dependent
step dt_t = softplus(W u_t + b), decay a_t = exp(-dt_t * exp(log_rate)) in
(0, 1) and input dt_t * (B u_t) (one state vector shared by all channels,
not Mamba's per-channel SISO heads).

``SSMBlock`` is ``layers.Block`` (x + mixer(norm(x), mask), then
x + MLP(norm(x))) with the biased GELU MLP of these stacks (``fc_mlp``).
``PostNormBlock`` is the block of the authors' released state-tracking code
(facts only): y = LayerNorm(mixer(x)), no residual around the mixer (its
D_skip * u term is the only skip path) and no MLP; with ``init='authors'``
and ``gate_hidden = 2N`` it is their block (``sequence_classifier`` registers
it as the 'pdssm_paper' mixer).
``BidirectionalMixer`` runs a forward and a reverse mixer and combines them
(sum, or concat + projection) for bidirectional diffusion denoisers.
``LSTMMixer`` wraps ``nnx.RNN(nnx.OptimizedLSTMCell)``. The straight-through
hardmax (``column_onehot_st`` and friends) lives in ``hardmax``.

Every mixer maps x_BxLxD -> y_BxLxD and takes an optional boolean
``mask_BxL``; masked steps become identity transitions with zero input, so a
right-padded tail does not leak into a reverse scan.

Parameters carry logical axis names ('embed', 'mlp', 'state', 'dict' for
the PD-SSM dictionary axis K, ...) as ``out_sharding`` metadata with
``eager_sharding=False`` (``layers.param``): modules build without a mesh,
and ``ddlm_jax.parallel.rules`` maps the names onto mesh axes. Dense layers
are ``layers.lecun_dense`` (biased, LeCun-normal init).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

import pallas_kernels
from ddlm_jax.models import layers
from ddlm_jax.models.hardmax import (
  assignment_indices,
  column_argmax,
  column_softmax,
  sinkhorn,
)
from ddlm_jax.models.layers import axes_meta, lecun_dense, param

MODES = ('pdssm', 'complex_diag', 'selective_diag')
SCAN_IMPLS = ('auto', 'reference', 'xla', 'pallas', 'interpret')
# h_0 of the scans: 'zeros', or 'onehot' = e_0 (the PD-SSM authors' released
# state-tracking code starts from e_0, so a pure permutation of the state
# already carries an automaton state before any input is written in).
INITIAL_STATES = ('zeros', 'onehot')
# Parameter inits: 'default' (this suite's, unchanged), or 'authors' (the
# scales of the PD-SSM authors' released state-tracking block, facts only):
# selector without bias, B_re/B_im ~ N(0, 1 / (2N)), D_skip ~ N(0, 1 / D),
# readout C with the std of a torch Linear(2N, D) (1 / sqrt(6N)) and a bias.
INITS = ('default', 'authors')
COMBINES = ('sum', 'concat')
# PD-SSM dictionary inits: 'random' (dense N(0, 1/N) entries: the column
# argmax of a mixture starts as a random function, whose image is ~63% of
# the states), or 'permutation' (see ``permutation_dictionary``: the
# argmax of EVERY mixture starts as a bijection).
DICT_INITS = ('random', 'permutation')
# SSMMixer.harden: how P_t is hardened from M_t.
HARDENINGS = ('argmax', 'matching')


def permutation_dictionary(key: jax.Array, num_dict: int, n: int) -> jax.Array:
  """K one-hot permutation matrices whose columns never share a row.

  M_k[:, j] = e_{p_k[j]} with p_k[j] = sigma[(tau[j] + k) mod N] for random
  permutations sigma and tau, so in every column j the K entries sit in K
  distinct rows. A mixture sum_k s_k M_k with s on the simplex then has, in
  every column, its maximum in the row of the same k* = argmax_k s_k: its
  column argmax IS the permutation p_{k*}, whatever the selector says, and
  each token of a PD-SSM starts as a random bijection of the states (maps
  that differ by a random relabelling, so together they generate a large,
  non-abelian permutation group). Needs K <= N.
  """
  if not 1 <= num_dict <= n:
    raise ValueError(
      f"dict_init='permutation' needs 1 <= num_dict <= state_size, got "
      f'num_dict={num_dict}, state_size={n}; lower num_dict.'
    )
  k_sigma, k_tau = jax.random.split(key)
  sigma = jax.random.permutation(k_sigma, n)
  tau = jax.random.permutation(k_tau, n)
  p_KxN = sigma[(tau[None, :] + jnp.arange(num_dict)[:, None]) % n]
  return jax.nn.one_hot(p_KxN, n, axis=-2)


# ----------------------------------------------------------------------------
# Pure math.


def pd_to_dense(p_idx_xN: jax.Array, d_xN: jax.Array) -> jax.Array:
  """Dense A with A[..., :, j] = d[..., j] e_{p[..., j]} (for references)."""
  n = p_idx_xN.shape[-1]
  return (
    jax.nn.one_hot(p_idx_xN, n, axis=-2, dtype=d_xN.dtype) * d_xN[..., None, :]
  )


def _shift_prev(
  h_BxLxN: jax.Array, h0_BxN: jax.Array, reverse: bool
) -> jax.Array:
  """State before each step: h_{t-1} (or h_{t+1} for a reverse scan)."""
  if reverse:
    return jnp.concatenate([h_BxLxN[:, 1:], h0_BxN[:, None]], axis=1)
  return jnp.concatenate([h0_BxN[:, None], h_BxLxN[:, :-1]], axis=1)


def dense_scan(
  a_BxLxNxN: jax.Array,
  b_BxLxN: jax.Array,
  h0_BxN: jax.Array,
  reverse: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """h_t = A_t h_{t-1} + b_t with dense A_t (the relaxed PD-SSM forward).

  O(N^2) per step instead of the one-hot scan's O(N); only the training
  forward of a relaxed PD-SSM uses it. Returns (h_BxLxN, h_last_BxN).
  """

  def step(h_BxN, ab):
    a_BxNxN, b_BxN = ab
    h_BxN = jnp.einsum('bij,bj->bi', a_BxNxN, h_BxN) + b_BxN
    return h_BxN, h_BxN

  dtype = jnp.result_type(a_BxLxNxN, b_BxLxN, h0_BxN)
  xs = (
    jnp.moveaxis(a_BxLxNxN, 1, 0).astype(dtype),
    jnp.moveaxis(b_BxLxN, 1, 0).astype(dtype),
  )
  h_last, h_LxBxN = jax.lax.scan(
    step, h0_BxN.astype(dtype), xs, reverse=reverse
  )
  return jnp.moveaxis(h_LxBxN, 0, 1), h_last


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def pd_scan_st(
  soft_BxLxNxN: jax.Array,
  d_BxLxN: jax.Array,
  b_BxLxN: jax.Array,
  h0_BxN: jax.Array,
  reverse: bool,
  impl: str,
) -> tuple[jax.Array, jax.Array]:
  """PD scan with hardened columns of ``soft`` and a straight-through grad.

  Forward: p_idx = column_argmax(soft) and ``pallas_kernels.pd_scan``.
  Backward: gradients for d, b, h0 come from pd_scan's own VJP; the
  cotangent of ``soft`` is that of a dense P_t at the hardened value,
  dL/dP_t[i, j] = Re(lam_t[i] * d_t[j] * h_{t-1}[j]) with lam_t = dL/db_t,
  i.e. exactly what ``hardmax.column_onehot_st`` gives when ``soft`` is the
  column softmax.

  Args:
    soft_BxLxNxN: real relaxed transition (column-stochastic in the layer).
    d_BxLxN: complex (or real) diagonal of D_t.
    b_BxLxN: inputs.
    h0_BxN: initial state.
    reverse: scan from the end (see ``pallas_kernels.pd_scan``).
    impl: scan implementation passed to ``pallas_kernels.pd_scan``.

  Returns:
    (h_BxLxN, h_last_BxN).
  """
  p_idx = column_argmax(soft_BxLxNxN)
  return pallas_kernels.pd_scan(
    p_idx, d_BxLxN, b_BxLxN, h0_BxN=h0_BxN, reverse=reverse, impl=impl
  )


def _pd_scan_st_fwd(soft, d, b, h0, reverse, impl):
  p_idx = column_argmax(soft)
  scan = lambda d_, b_, h0_: pallas_kernels.pd_scan(
    p_idx, d_, b_, h0_BxN=h0_, reverse=reverse, impl=impl
  )
  (h, h_last), vjp = jax.vjp(scan, d, b, h0)
  return (h, h_last), (vjp, d, h, h0)


def _pd_scan_st_bwd(reverse, impl, res, cts):
  vjp, d, h, h0 = res
  g_d, lam, g_h0 = vjp(cts)  # lam_t = dL/db_t, the adjoint state
  v = d * _shift_prev(h, h0, reverse).astype(d.dtype)
  g_soft = jnp.einsum('bli,blj->blij', lam, v)
  if jnp.iscomplexobj(g_soft):
    g_soft = jnp.real(g_soft)
  return g_soft, g_d, lam, g_h0


pd_scan_st.defvjp(_pd_scan_st_fwd, _pd_scan_st_bwd)


# ----------------------------------------------------------------------------
# Layers.


def fc_mlp(
  d_in: int,
  hidden: int,
  d_out: int,
  out_axis: str,
  *,
  rngs: nnx.Rngs,
  param_dtype=jnp.float32,
) -> layers.MLP:
  """Biased two-layer GELU MLP (fc1, fc2), d_in -> hidden -> d_out.

  The gate MLPs of D_t (out_axis 'state') and the MLP of ``SSMBlock``
  (out_axis 'embed').
  """
  return layers.MLP(
    d_in,
    hidden,
    'gelu',
    rngs=rngs,
    out_dim=d_out,
    axes=('embed', 'mlp', out_axis),
    use_bias=True,
    init=nnx.initializers.lecun_normal(),
    param_dtype=param_dtype,
    names=layers.FC1_FC2,
  )


def _per_token(u_BxLxD: jax.Array, token_ids: tuple[jax.Array, int] | None):
  """(inputs to compute transitions on, spread back to [B, L, ...]).

  Without token_ids: u itself and the identity. With (ids_BxL, V), where
  u_t is a function of ids[t] alone: u_1xVxD, the mean of u over each id's
  positions (equal rows, so the mean is that row; an id absent from the
  batch gets zeros, and its transition is never read), and a gather by ids.
  The mean's gradient shares each id's cotangent evenly among its
  positions, whose sum is what the per-position computation gives.
  """
  if token_ids is None:
    return u_BxLxD, lambda x: x
  ids_BxL, num_ids = token_ids
  D = u_BxLxD.shape[-1]
  flat_ids = ids_BxL.reshape(-1)
  total_VxD = jax.ops.segment_sum(
    u_BxLxD.reshape(-1, D), flat_ids, num_segments=num_ids
  )
  count_V = jax.ops.segment_sum(
    jnp.ones_like(flat_ids, u_BxLxD.dtype), flat_ids, num_segments=num_ids
  )
  u_1xVxD = (total_VxD / jnp.maximum(count_V, 1)[:, None])[None]
  return u_1xVxD, lambda x_1xVx: x_1xVx[0][ids_BxL]


class SSMMixer(nnx.Module):
  """PD-SSM / complex-diagonal / selective real-diagonal mixer, D -> D.

  Attributes:
    mode: 'pdssm' | 'complex_diag' | 'selective_diag'.
    reverse: scan from the end of the sequence.
    scan_impl: passed to pallas_kernels ('auto' | 'reference' | 'xla' |
      'pallas' | 'interpret'); may be reassigned after construction.
    relax_temperature: None (the paper's layer: hardmax forward,
      straight-through gradient), or a temperature T > 0 (a float or a
      traced scalar, set on the module for a training step): the forward
      then runs the dense relaxed P_t = sinkhorn(M_t, T) and its exact
      gradient. Annealing T towards 0 trains the maps towards bijections;
      evaluation leaves it None, so the model evaluated is the paper's.
    relax_hard: None / False (with ``relax_temperature``: the relaxed
      forward), or True (a bool or a traced scalar, set for a training
      step): the forward runs the hardened P_t of evaluation
      (``transition_indices``) and the backward the gradient of the relaxed
      sinkhorn(M_t, T), P = P_hard + P_soft - stop_gradient(P_soft). Train
      and evaluation then see the same layer while the gradient still
      reaches every entry of M_t.
    relax_noise: None, or a scale sigma >= 0 (a float or a traced scalar,
      set with ``relax_key`` for a training step): the relaxed forward runs
      sinkhorn((M_t + sigma g) / T) with g ~ Gumbel(0, 1) drawn
      independently for every entry (the Gumbel-Sinkhorn estimator of a
      random permutation), so training samples permutations near the
      current one instead of always following the same relaxation.
      Evaluation and the straight-through hardening never add noise.
    relax_key: the PRNG key of that noise.
    sinkhorn_iters: Sinkhorn iterations of the relaxed forward.
    harden_temperature: None (the paper: P_t = hardmax of M_t's columns),
      or T1 > 0: P_t = hardmax of sinkhorn(M_t, T1)'s columns, the
      hardening that matches a run relaxed down to T1.
    phase_init: None (default init), or the initial phase of D_t in turns
      (a fraction of 2 pi), the same for every token and state.
    input_init_scale: B (pdssm, complex_diag) starts as this multiple of
      its default init; 0 starts the layer without input.
    dict_init_scale: the PD-SSM dictionary starts as this multiple (> 0) of
      its init. The hardened P_t (and, with ``relax_normalize``, the
      relaxed one) does not depend on it; Adam's steps do not scale with
      the parameters, so a small dictionary lets training reorder the
      columns of M_t (change a token's permutation) in fewer steps.
    harden: 'argmax' (the paper: every column of P_t is one-hot at its
      own maximum, ``column_argmax``) or 'matching': P_t is the permutation
      maximising the sum of the Sinkhorn input's entries it selects
      (``hardmax.assignment_indices``), the T -> 0 limit of the Sinkhorn
      relaxation. Still a one-hot P_t, and always a bijection, where
      column maxima can collide (a relaxation of N = 60 states hardened by
      argmax kept 55-58 of 60 rows).
    relax_normalize: Sinkhorn (relaxed forward and ``harden_temperature``)
      reads M_t with every column standardised (zero mean, unit std over
      rows). The column argmax is unchanged, but the model can no longer
      keep its relaxation soft by shrinking M_t, so the temperature alone
      sets how close to a permutation the relaxed P_t is.
  """

  def __init__(
    self,
    d_model: int,
    state_size: int,
    *,
    mode: str = 'pdssm',
    num_dict: int = 8,
    gate_hidden: int | None = None,
    reverse: bool = False,
    scan_impl: str = 'auto',
    st_temperature: float = 1.0,
    max_magnitude: float = 1.0 - 1e-6,
    initial_state: str = 'zeros',
    init: str = 'default',
    magnitude_init: float | None = None,
    dict_init: str = 'random',
    harden_temperature: float | None = None,
    relax_normalize: bool = False,
    harden: str = 'argmax',
    phase_init: float | None = None,
    input_init_scale: float = 1.0,
    dict_init_scale: float = 1.0,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    if dict_init not in DICT_INITS:
      raise ValueError(
        f'dict_init must be one of {DICT_INITS}, got {dict_init!r}.'
      )
    if init not in INITS:
      raise ValueError(f'init must be one of {INITS}, got {init!r}.')
    if magnitude_init is not None and not 0.0 < magnitude_init < 1.0:
      raise ValueError(
        f'magnitude_init must be in (0, 1) (or None), got {magnitude_init}.'
      )
    if input_init_scale < 0:
      raise ValueError(
        f'input_init_scale must be >= 0, got {input_init_scale}.'
      )
    if phase_init is not None and not 0.0 < phase_init < 1.0:
      raise ValueError(
        f'phase_init must be in (0, 1) turns (or None), got {phase_init}.'
      )
    if mode not in MODES:
      raise ValueError(f'mode must be one of {MODES}, got {mode!r}.')
    if scan_impl not in SCAN_IMPLS:
      raise ValueError(
        f'scan_impl must be one of {SCAN_IMPLS}, got {scan_impl!r}.'
      )
    if initial_state not in INITIAL_STATES:
      raise ValueError(
        f'initial_state must be one of {INITIAL_STATES}, got {initial_state!r}.'
      )
    if d_model < 1 or state_size < 1 or num_dict < 1:
      raise ValueError(
        'd_model, state_size and num_dict must be >= 1, got '
        f'{d_model}, {state_size}, {num_dict}.'
      )
    if not 0.0 < max_magnitude <= 1.0 or st_temperature <= 0:
      raise ValueError(
        'need 0 < max_magnitude <= 1 and st_temperature > 0, got '
        f'{max_magnitude}, {st_temperature}.'
      )
    D, N = d_model, state_size
    H = gate_hidden or d_model
    self.d_model, self.state_size, self.mode = D, N, mode
    self.num_dict = num_dict
    self.reverse = reverse
    self.scan_impl = scan_impl
    self.st_temperature = float(st_temperature)
    self.max_magnitude = float(max_magnitude)
    self.initial_state = initial_state
    self.init = init
    self.relax_temperature = None
    self.relax_hard = None
    # Gumbel-Sinkhorn exploration of a relaxed forward (set per training
    # step, like relax_temperature): the Sinkhorn input gets
    # relax_noise * Gumbel(0, 1) noise drawn from relax_key.
    self.relax_noise = None
    self.relax_key = None
    # Set by a relaxed forward: mean entropy (nats) of the relaxed P_t's
    # columns, 0 exactly at a permutation (model.relax_entropy_weight).
    self.relax_entropy = None
    # Set by a relaxed forward as well: mean squared phase of D_t (radians,
    # wrapped to [-pi, pi]), 0 when every state keeps its phase
    # (model.phase_penalty_weight).
    self.phase_square = None
    self.sinkhorn_iters = 20
    if not dict_init_scale > 0:
      raise ValueError(f'dict_init_scale must be > 0, got {dict_init_scale}.')
    if harden_temperature is not None and harden_temperature <= 0:
      raise ValueError(
        f'harden_temperature must be > 0 (or None), got {harden_temperature}.'
      )
    self.harden_temperature = harden_temperature
    self.relax_normalize = bool(relax_normalize)
    if harden not in HARDENINGS:
      raise ValueError(f'harden must be one of {HARDENINGS}, got {harden!r}.')
    self.harden = harden
    pd = dict(param_dtype=param_dtype)
    authors = init == 'authors'
    # normal(fan**-0.5) parameters, drawn in the order written here.
    normal = lambda fan, shape, axes: param(
      rngs, nnx.initializers.normal(1 / math.sqrt(fan)), shape, axes,
      param_dtype,
    )  # fmt: skip
    fan_b = 2 * N if authors else D  # B std: 1/sqrt(2N) (authors) or 1/sqrt(D)
    fan_c = 6 * N if authors else N  # C std: torch Linear(2N, .) or 1/sqrt(N)
    if mode == 'pdssm':
      if authors:
        self.select = layers.Dense(
          (D,), (num_dict,), ('embed',), ('dict',), rngs=rngs,
          init=nnx.initializers.lecun_normal(), param_dtype=param_dtype,
        )  # fmt: skip
      else:
        self.select = lecun_dense(
          D, num_dict, ('embed', 'dict'), rngs=rngs, **pd
        )
      self.dictionary = normal(N, (num_dict, N, N), ('dict', 'state', None))
      if dict_init == 'permutation':
        self.dictionary[...] = permutation_dictionary(
          rngs.params(), num_dict, N
        ).astype(param_dtype)
      if dict_init_scale != 1.0:
        # The column argmax (and, with relax_normalize, the relaxation)
        # ignores M_t's scale, so a smaller dictionary is the same layer
        # whose entries an optimiser of fixed step size reorders sooner.
        self.dictionary[...] = dict_init_scale * self.dictionary[...]
    if mode in ('pdssm', 'complex_diag'):
      self.mag_mlp = fc_mlp(D, H, N, 'state', rngs=rngs, **pd)
      self.phase_mlp = fc_mlp(D, H, N, 'state', rngs=rngs, **pd)
      if magnitude_init is not None:
        # |D_t| starts near magnitude_init (sigmoid of the output bias), so
        # the state survives a training-length sequence at initialisation.
        logit = math.log(magnitude_init / (1.0 - magnitude_init))
        self.mag_mlp.fc2.bias[...] = jnp.full((N,), logit, param_dtype)
      if phase_init is not None:
        # Every phase of D_t starts at 2 pi phase_init for every token (the
        # output kernel zeroed): a small value leaves the state's phase
        # nearly path-independent, so a permutation solution is read out
        # the same way after any word (the default init draws each token's
        # phases around pi, and their sums along a word wander).
        logit = math.log(phase_init / (1.0 - phase_init))
        self.phase_mlp.fc2.bias[...] = jnp.full((N,), logit, param_dtype)
        self.phase_mlp.fc2.kernel[...] = jnp.zeros_like(
          self.phase_mlp.fc2.kernel[...]
        )
      self.B_re = normal(fan_b, (D, N), ('embed', 'state'))
      self.B_im = normal(fan_b, (D, N), ('embed', 'state'))
      if input_init_scale != 1.0:
        # A permutation state started at h_0 = e_0 needs no input; the
        # input a random B adds every step piles up over long words.
        self.B_re[...] = input_init_scale * self.B_re[...]
        self.B_im[...] = input_init_scale * self.B_im[...]
      self.C_im = normal(fan_c, (N, D), ('state', 'embed'))
    else:
      self.dt_proj = lecun_dense(D, N, ('embed', 'state'), rngs=rngs, **pd)
      # Mamba-style init: dt log-uniform in [1e-3, 1e-1], rates 1..N.
      dt = jnp.exp(
        jax.random.uniform(rngs.params(), (N,))
        * (math.log(0.1) - math.log(1e-3))
        + math.log(1e-3)
      )
      self.dt_proj.bias[...] = (dt + jnp.log(-jnp.expm1(-dt))).astype(
        param_dtype
      )
      self.log_rate = nnx.Param(
        jnp.log(jnp.arange(1, N + 1, dtype=param_dtype)),
        **axes_meta('state'),
      )
      self.B_re = normal(fan_b, (D, N), ('embed', 'state'))
    self.C_re = normal(fan_c, (N, D), ('state', 'embed'))
    if authors:
      self.d_skip = normal(D, (D,), ('embed',))
      self.readout_bias = nnx.Param(
        jnp.zeros((D,), param_dtype), **axes_meta('embed')
      )
    else:
      self.d_skip = nnx.Param(jnp.ones((D,), param_dtype), **axes_meta('embed'))
      self.readout_bias = None

  # -- transitions -----------------------------------------------------------

  def diagonal(self, u_BxLxD: jax.Array) -> jax.Array:
    """D_t (complex modes) or the real decay a_t (selective_diag)."""
    if self.mode == 'selective_diag':
      rate = jnp.exp(self.log_rate[...])
      dt = jax.nn.softplus(self.dt_proj(u_BxLxD))
      return jnp.minimum(jnp.exp(-dt * rate), self.max_magnitude)
    mag = jnp.minimum(jax.nn.sigmoid(self.mag_mlp(u_BxLxD)), self.max_magnitude)
    phase = 2 * jnp.pi * jax.nn.sigmoid(self.phase_mlp(u_BxLxD))
    return jax.lax.complex(mag * jnp.cos(phase), mag * jnp.sin(phase))

  def mixture(self, u_BxLxD: jax.Array) -> jax.Array:
    """M_t = sum_k softmax(S u_t)_k M_k, [B, L, N, N]."""
    s_BxLxK = jax.nn.softmax(self.select(u_BxLxD), axis=-1)
    return jnp.einsum('blk,kij->blij', s_BxLxK, self.dictionary[...])

  def _record(self, name: str, value: jax.Array) -> None:
    """Keeps a loss term of a traced (training) forward on the module.

    nnx refuses a concrete array on a static attribute, so an eager call
    (a test, an analysis) leaves the term unset; the training step, which
    always traces, reads it.
    """
    try:
      setattr(self, name, value)
    except ValueError:
      pass

  def relaxed_transition(self, u_BxLxD: jax.Array) -> jax.Array:
    """Column softmax of M_t (the straight-through surrogate), or with
    ``harden_temperature`` T1 the Sinkhorn matrix sinkhorn(M_t, T1), so the
    hardmax reads the columns of the matrix a relaxed run trained towards.
    """
    return self._hardening(self.mixture(u_BxLxD))

  def _hardening(self, m_BxLxNxN: jax.Array) -> jax.Array:
    """The matrix whose column argmax is the hardened P_t, from M_t."""
    if self.harden_temperature is not None:
      return sinkhorn(
        self._sinkhorn_input(m_BxLxNxN),
        self.harden_temperature,
        self.sinkhorn_iters,
      )
    return column_softmax(m_BxLxNxN, self.st_temperature)

  def _sinkhorn_input(self, m_BxLxNxN: jax.Array) -> jax.Array:
    """M_t as Sinkhorn reads it: column-standardised with relax_normalize."""
    if not self.relax_normalize:
      return m_BxLxNxN
    mean = m_BxLxNxN.mean(axis=-2, keepdims=True)
    std = m_BxLxNxN.std(axis=-2, keepdims=True)
    return (m_BxLxNxN - mean) / (std + 1e-6)

  @property
  def uses_sinkhorn(self) -> bool:
    """Whether P_t goes through a Sinkhorn (or an assignment) now: a
    relaxed training step, or a Sinkhorn or matching hardening."""
    return (
      self.relax_temperature is not None
      or self.harden_temperature is not None
      or self.harden == 'matching'
    )

  def transition_indices(self, u_BxLxD: jax.Array) -> jax.Array:
    """p_idx_BxLxN of the hardened P_t (pdssm only)."""
    return self._hard_indices(self.mixture(u_BxLxD))

  def _hard_indices(self, m_BxLxNxN: jax.Array) -> jax.Array:
    """p_idx of the hardened P_t from M_t (see ``harden``)."""
    if self.harden == 'matching':
      return assignment_indices(self._sinkhorn_input(m_BxLxNxN))
    return column_argmax(self._hardening(m_BxLxNxN))

  def _straight_through(self, m_BxLxNxN, soft_BxLxNxN) -> jax.Array:
    """One-hot columns of the hardened P_t forward (soft - stop_gradient
    (soft) is exactly 0), the gradient of soft backward."""
    hard = jax.nn.one_hot(
      self._hard_indices(m_BxLxNxN),
      self.state_size,
      axis=-2,
      dtype=soft_BxLxNxN.dtype,
    )
    return hard + (soft_BxLxNxN - jax.lax.stop_gradient(soft_BxLxNxN))

  def inputs(self, u_BxLxD: jax.Array) -> jax.Array:
    """b_t = B u_t (complex), or dt_t * B u_t (selective_diag, real)."""
    b_re = u_BxLxD @ self.B_re[...]
    if self.mode == 'selective_diag':
      return jax.nn.softplus(self.dt_proj(u_BxLxD)) * b_re
    return jax.lax.complex(b_re, u_BxLxD @ self.B_im[...])

  # -- forward ---------------------------------------------------------------

  def states(
    self,
    u_BxLxD: jax.Array,
    mask_BxL: jax.Array | None = None,
    h0_BxN: jax.Array | None = None,
    token_ids: tuple[jax.Array, int] | None = None,
  ) -> tuple[jax.Array, jax.Array]:
    """Runs the recurrence; returns (h_BxLxN, h_last_BxN).

    token_ids (pdssm only): (ids_BxL, V) from a caller whose input u_t is a
    function of ids[t] < V alone (the first layer of a model without
    position embeddings). The transition P_t, the costly part (a Sinkhorn
    over N x N per position when relaxed or hardened through Sinkhorn), is
    then computed once per id and gathered: the same values and gradients
    (up to rounding), V instead of B * L matrices. Ignored with Gumbel
    noise, which is drawn per position.
    """
    if u_BxLxD.ndim != 3 or u_BxLxD.shape[-1] != self.d_model:
      raise ValueError(
        f'expected u_BxLxD with D={self.d_model}, got shape {u_BxLxD.shape}.'
      )
    B, L, _ = u_BxLxD.shape
    N = self.state_size
    d = self.diagonal(u_BxLxD)
    b = self.inputs(u_BxLxD)
    if h0_BxN is None:
      h0_BxN = jnp.zeros((B, N), b.dtype)
      if self.initial_state == 'onehot':
        h0_BxN = h0_BxN.at[:, 0].set(1)
    h0_BxN = h0_BxN.astype(b.dtype)
    if mask_BxL is not None:
      if mask_BxL.shape != (B, L):
        raise ValueError(
          f'mask_BxL must have shape {(B, L)}, got {mask_BxL.shape}.'
        )
      keep = mask_BxL.astype(bool)[..., None]
      d = jnp.where(keep, d, jnp.ones_like(d))
      b = jnp.where(keep, b, jnp.zeros_like(b))
    if self.mode != 'pdssm':
      return pallas_kernels.linear_scan(
        d, b, h0_BxN=h0_BxN, reverse=self.reverse, impl=self.scan_impl
      )
    noisy = self.relax_noise is not None and self.relax_key is not None
    u_tr, spread = _per_token(u_BxLxD, None if noisy else token_ids)
    if self.relax_temperature is not None:
      m = self.mixture(u_tr)
      logits = self._sinkhorn_input(m)
      if noisy:
        logits = logits + self.relax_noise * jax.random.gumbel(
          self.relax_key, logits.shape, logits.dtype
        )
      soft = sinkhorn(logits, self.relax_temperature, self.sinkhorn_iters)
      turns = jax.nn.sigmoid(self.phase_mlp(u_BxLxD))
      wrapped = 2 * jnp.pi * jnp.minimum(turns, 1.0 - turns)
      self._record('phase_square', jnp.mean(wrapped**2))
      entropy = -jnp.sum(soft * jnp.log(jnp.maximum(soft, 1e-12)), -2)
      self._record('relax_entropy', jnp.mean(spread(entropy)))
      if self.relax_hard is not None:
        # The hardened P_t forward, the relaxation's gradient backward.
        soft = jnp.where(self.relax_hard, self._straight_through(m, soft), soft)
      soft = spread(soft)
    else:
      m = self.mixture(u_tr)
      soft = self._hardening(m)
      if self.harden == 'matching':
        # pd_scan_st reads the column argmax of this: the matching.
        soft = self._straight_through(m, soft)
      soft = spread(soft)
    if mask_BxL is not None:
      eye = jnp.eye(N, dtype=soft.dtype)
      soft = jnp.where(keep[..., None], soft, eye)
    if self.relax_temperature is not None:
      # A_t = P_t D_t: column j of the relaxed P_t scaled by d_t[j].
      return dense_scan(soft * d[..., None, :], b, h0_BxN, self.reverse)
    return pd_scan_st(soft, d, b, h0_BxN, self.reverse, self.scan_impl)

  def readout(self, h_BxLxN: jax.Array, u_BxLxD: jax.Array) -> jax.Array:
    """y_t = Re(C h_t) (+ bias, init='authors') + D_skip * u_t."""
    if self.mode == 'selective_diag':
      y = h_BxLxN @ self.C_re[...]
    else:
      y = jnp.real(h_BxLxN) @ self.C_re[...] - (
        jnp.imag(h_BxLxN) @ self.C_im[...]
      )
    if self.readout_bias is not None:
      y = y + self.readout_bias[...]
    return y + self.d_skip[...] * u_BxLxD

  def __call__(
    self,
    u_BxLxD: jax.Array,
    mask_BxL: jax.Array | None = None,
    token_ids: tuple[jax.Array, int] | None = None,
  ) -> jax.Array:
    h, _ = self.states(u_BxLxD, mask_BxL, token_ids=token_ids)
    return self.readout(h, u_BxLxD)


class LSTMMixer(nnx.Module):
  """LSTM baseline mixer (nnx.OptimizedLSTMCell), D -> hidden -> D."""

  def __init__(
    self,
    d_model: int,
    hidden: int | None = None,
    *,
    reverse: bool = False,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    H = hidden or d_model
    self.hidden = H
    self.reverse = reverse
    cell = nnx.OptimizedLSTMCell(
      d_model,
      H,
      param_dtype=param_dtype,
      kernel_metadata=axes_meta('embed', 'mlp'),
      recurrent_kernel_metadata=axes_meta('mlp', None),
      bias_metadata=axes_meta('mlp'),
      rngs=rngs,
    )
    self.rnn = nnx.RNN(cell, reverse=reverse, keep_order=True, rngs=False)
    self.out = (
      lecun_dense(
        H, d_model, ('mlp', 'embed'), rngs=rngs, param_dtype=param_dtype
      )
      if H != d_model
      else None
    )

  def __call__(
    self, x_BxLxD: jax.Array, mask_BxL: jax.Array | None = None
  ) -> jax.Array:
    lengths = None
    if mask_BxL is not None:
      # Assumes right padding (mask is a prefix of True).
      lengths = mask_BxL.astype(jnp.int32).sum(-1)
    zeros = jnp.zeros((x_BxLxD.shape[0], self.hidden), x_BxLxD.dtype)
    y = self.rnn(x_BxLxD, initial_carry=(zeros, zeros), seq_lengths=lengths)
    return y if self.out is None else self.out(y)


class BidirectionalMixer(nnx.Module):
  """Forward and reverse mixers (separate parameters), summed or projected.

  ``make(reverse, rngs)`` builds one direction, e.g.
  ``lambda reverse, rngs: SSMMixer(D, N, reverse=reverse, rngs=rngs)``.
  """

  def __init__(
    self,
    d_model: int,
    make: Callable[[bool, nnx.Rngs], nnx.Module],
    *,
    combine: str = 'sum',
    rngs: nnx.Rngs,
  ):
    if combine not in COMBINES:
      raise ValueError(f'combine must be one of {COMBINES}, got {combine!r}.')
    self.combine = combine
    self.fwd = make(False, rngs)
    self.bwd = make(True, rngs)
    self.proj = (
      lecun_dense(2 * d_model, d_model, ('mlp', 'embed'), rngs=rngs)
      if combine == 'concat'
      else None
    )

  def __call__(
    self, x_BxLxD: jax.Array, mask_BxL: jax.Array | None = None
  ) -> jax.Array:
    y_f = self.fwd(x_BxLxD, mask_BxL)
    y_b = self.bwd(x_BxLxD, mask_BxL)
    if self.proj is None:
      return y_f + y_b
    return self.proj(jnp.concatenate([y_f, y_b], axis=-1))


class SSMBlock(layers.Block):
  """``layers.Block`` around any mixer, called as block(x, mask_BxL).

  x <- x + mixer(norm1(x), mask); x <- x + MLP(norm2(x)), with the biased
  GELU ``fc_mlp`` of hidden width mlp_ratio * D. The paper describes "SSM,
  then norm and an MLP with residual"; we put a residual and a pre-norm
  around the mixer as well, the usual stable choice for stacked blocks. The
  mixer is built by the caller, so it draws its rngs keys before the norms.
  """

  def __init__(
    self,
    d_model: int,
    mixer: nnx.Module,
    *,
    mlp_ratio: float = 2.0,
    rngs: nnx.Rngs,
  ):
    hidden = max(1, int(mlp_ratio * d_model))
    super().__init__(
      d_model,
      lambda _: mixer,
      lambda r: fc_mlp(d_model, hidden, d_model, 'embed', rngs=r),
      rngs=rngs,
    )

  def __call__(
    self,
    x_BxLxD: jax.Array,
    mask_BxL: jax.Array | None = None,
    token_ids: tuple[jax.Array, int] | None = None,
  ) -> jax.Array:
    """token_ids: passed to the mixer (see ``SSMMixer.states``)."""
    kw = {} if token_ids is None else {'token_ids': token_ids}
    return super().__call__(x_BxLxD, mask_BxL=mask_BxL, **kw)


class PostNormBlock(nnx.Module):
  """y = LayerNorm(mixer(x, mask)): post-norm, no residual, no MLP.

  The PD-SSM authors' state-tracking block; the mixer's own D_skip * u_t
  is its only skip path. Called as block(x_BxLxD, mask_BxL).
  """

  def __init__(self, d_model: int, mixer: nnx.Module, *, rngs: nnx.Rngs):
    self.mixer = mixer
    self.norm = nnx.LayerNorm(
      d_model,
      epsilon=1e-5,
      scale_metadata=axes_meta('embed'),
      bias_metadata=axes_meta('embed'),
      rngs=rngs,
    )

  def __call__(
    self,
    x_BxLxD: jax.Array,
    mask_BxL: jax.Array | None = None,
    token_ids: tuple[jax.Array, int] | None = None,
  ) -> jax.Array:
    """token_ids: passed to the mixer (see ``SSMMixer.states``)."""
    return self.norm(self.mixer(x_BxLxD, mask_BxL, token_ids))


def make_mixer(
  kind: str,
  d_model: int,
  *,
  state_size: int = 128,
  num_dict: int = 8,
  bidirectional: bool = False,
  combine: str = 'sum',
  scan_impl: str = 'auto',
  rngs: nnx.Rngs,
  **kwargs,
) -> nnx.Module:
  """Builds a mixer by name: 'pdssm' | 'complex_diag' | 'selective_diag' |
  'lstm', optionally bidirectional. ``kwargs`` go to SSMMixer / LSTMMixer.
  """
  if kind == 'lstm':
    make = lambda reverse, r: LSTMMixer(
      d_model, reverse=reverse, rngs=r, **kwargs
    )
  elif kind in MODES:
    make = lambda reverse, r: SSMMixer(
      d_model,
      state_size,
      mode=kind,
      num_dict=num_dict,
      reverse=reverse,
      scan_impl=scan_impl,
      rngs=r,
      **kwargs,
    )
  else:
    raise ValueError(
      f'unknown mixer {kind!r}; choose one of {MODES + ("lstm",)}.'
    )
  if bidirectional:
    return BidirectionalMixer(d_model, make, combine=combine, rngs=rngs)
  return make(False, rngs)
