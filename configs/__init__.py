"""The YAML presets shipped with the package as `pvpo.configs` (package data: a wheel carries these
very files), found by name with `pvpo.trainer.config.presets.preset_path`."""
