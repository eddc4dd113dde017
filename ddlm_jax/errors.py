"""The library's error types, importable from every layer."""


class ConfigError(ValueError):
  """A config value outside its allowed range; names the key and the fix."""
