"""Presets: tested operation and read rules for APIs agents commonly write to, as plain YAML files in this folder
(`receipts rules show --preset NAME` prints one). A host says `preset: NAME`; its own keys win over the preset's,
and an operation rule of its own replaces the preset's rule of the same name (config/hosts.py merges them).

Each preset ships only with a test against a real implementation of its API that nobody here wrote
(tests/e2e/test_presets_*.py): docs/configuration.md#presets says what each proves.
"""

from functools import cache
from importlib import resources
from typing import Any

import yaml

SUFFIX = ".yaml"


def known_presets() -> list[str]:
    return sorted(f.name.removesuffix(SUFFIX) for f in resources.files(__package__).iterdir() if f.name.endswith(SUFFIX))


def preset_text(name: str) -> str:
    """The preset's YAML as shipped, comments included; KeyError naming the known ones when there is none."""
    if name not in known_presets():
        raise KeyError(unknown_preset(name))
    return resources.files(__package__).joinpath(name + SUFFIX).read_text(encoding="utf-8")


@cache
def preset_keys(name: str) -> dict[str, Any]:
    """The host keys the preset gives (a copy is made by the caller before it is changed)."""
    data = yaml.safe_load(preset_text(name))
    if not isinstance(data, dict):
        raise ValueError(f"preset {name} is not a mapping of host keys")
    return data


def unknown_preset(name: str) -> str:
    return f"unknown preset {name!r} (known: {', '.join(known_presets())})"


def with_preset(host: dict[str, Any]) -> dict[str, Any]:
    """A host's keys over its preset's: each key the host gives wins; its operation rules come first and replace
    the preset's rules of the same name. A host without a known preset is returned as it is."""
    name = host.get("preset")
    if not isinstance(name, str) or name not in known_presets():
        return host
    preset = preset_keys(name)
    merged = {**{k: v for k, v in preset.items() if k != "operations"}, **host}
    own = host.get("operations") or []
    names = {op.get("name") for op in own if isinstance(op, dict)}
    merged["operations"] = [*own, *(op for op in preset.get("operations", []) if op.get("name") not in names)]
    return merged
