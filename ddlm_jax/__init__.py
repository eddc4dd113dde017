"""ddlm_jax: discrete diffusion language models in JAX.

`ddlm_jax.load(workdir)` (ddlm_jax.api) is the Python entry point; it is
imported on first use, so `import ddlm_jax` stays cheap (no JAX start-up).
"""

_API = ('Model', 'Score', 'load')


def __getattr__(name: str):
  if name in _API:
    from ddlm_jax import api

    return getattr(api, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(list(globals()) + list(_API))
