"""The networks a run can train, by their `config.model.backbone` name.

A backbone is two functions: `config(model, process)` turns the run's
model block (a plain dict) and its process into the network's config, and
`build(config, model, rngs)` makes the network. The built-in transformer
and hybrid register where the run's builders live; a package that brings
its own networks (the LLaDA / Dream converters of `ddlm_jax.interop`)
registers them when imported. So the layer that builds a run names no
backbone, and this module imports nothing above the networks.

A name not yet registered first imports the modules of `PROVIDERS` (names
as strings: a lookup, not an import edge) in case one of them registers it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

# Modules that register backbones when imported, tried on a lookup miss.
PROVIDERS = (
  'ddlm_jax.interop.llama_family',
  'ddlm_jax.models.dgemma_backbone',
  'ddlm_jax.models.dit',
  'ddlm_jax.models.pgm',
)


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
  """One registered backbone (module docstring)."""

  name: str
  config: Callable[[Mapping[str, Any], Any], Any]
  build: Callable[[Any, Mapping[str, Any], Any], Any]


_REGISTRY: dict[str, BackboneSpec] = {}


def register_backbone(
  name: str,
  config: Callable[[Mapping[str, Any], Any], Any],
  build: Callable[[Any, Mapping[str, Any], Any], Any],
) -> BackboneSpec:
  """Registers backbone `name`; registering it again replaces it."""
  spec = BackboneSpec(name=name, config=config, build=build)
  _REGISTRY[name] = spec
  return spec


def registered_backbones() -> tuple[str, ...]:
  return tuple(_REGISTRY)


def _load_providers() -> None:
  for module in PROVIDERS:
    try:
      importlib.import_module(module)
    except ImportError:  # An optional provider whose extra is absent.
      continue


def get_backbone(name: str) -> BackboneSpec:
  """The backbone registered as `name`.

  Raises:
    ValueError: no such backbone, naming the closest registered one.
  """
  if name not in _REGISTRY:
    _load_providers()
  if name not in _REGISTRY:
    known = registered_backbones()
    close = difflib.get_close_matches(str(name), list(known), n=1)
    hint = f' (did you mean {close[0]!r}?)' if close else ''
    raise ValueError(
      f'model.backbone={name!r} is not a registered backbone{hint}; '
      f'choose one of {known}.'
    )
  return _REGISTRY[name]


__all__ = [
  'PROVIDERS',
  'BackboneSpec',
  'get_backbone',
  'register_backbone',
  'registered_backbones',
]
