"""config.yaml's `agents:`, edited in place for `receipts agents add` and `rm` (cli/agents.py).

The file is edited as text, at the places PyYAML's composer finds (each node's start and end): one line added
or an agent's lines removed, every other byte as it was, comments and layout included (a YAML round trip
writes the whole file again in its own layout, and moves comments that follow an empty key). The result is
validated as a config before it replaces the file (atomically, with the file's permissions), so an edit never
leaves a config the proxy would refuse. The token is printed once and kept nowhere: the file holds its salted
hash (agents/tokens.py). A running proxy reads `agents:` when it starts.
"""

import os
import tempfile
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from proxy_addon.config import ReceiptsConfig, parse_config
from proxy_addon.exceptions import ConfigError

SECTION = "agents"
NULL_TAG = "tag:yaml.org,2002:null"


def added(text: str, name: str, stored_hash: str) -> str:
    """The config text with `name: {token_hash: ...}` added under `agents:` (made at the end when absent)."""
    root = _root(text)
    entry = f"{name}: {{token_hash: {stored_hash}}}"
    found = _section(root)
    if found is None:
        indent = " " * _nested_indent(root)
        return f"{text}{'' if text.endswith(chr(10)) or not text else chr(10)}{SECTION}:\n{indent}{entry}\n"
    key, value = found
    if isinstance(value, MappingNode) and value.value and not value.flow_style:
        if name in _names(value):
            raise ConfigError(f"agent {name} exists: `receipts agents rm {name}` first, then add it again for a new token")
        column = value.value[0][0].start_mark.column
        return _insert_after(text, _last_line(value.value[-1][1]), " " * column + entry)
    if _is_empty(value):  # `agents:` alone, `agents: null`, `agents: {}`: the value's text goes, the entry goes below
        before, after = text[: value.start_mark.index], text[value.end_mark.index :]
        text = (before.rstrip(" \t") if after[:1] in ("", "\n") else before) + after
        return _insert_after(text, key.start_mark.line, " " * _nested_indent(root) + entry)
    raise ConfigError(f"{SECTION}: is not a block of one agent per line; write it so to let `receipts agents` edit it")


def removed(text: str, name: str) -> str:
    """The config text without the agent `name`'s lines."""
    found = _section(_root(text))
    value = found[1] if found is not None else None
    if not isinstance(value, MappingNode) or name not in _names(value):
        raise ConfigError(f"no agent {name} in {SECTION}:")
    if value.flow_style:
        raise ConfigError(f"{SECTION}: is one flow mapping ({{...}}); write it one agent per line to let `receipts agents` edit it")
    key, entry = next((k, v) for k, v in value.value if k.value == name)
    lines = text.splitlines(keepends=True)
    del lines[key.start_mark.line : _last_line(entry) + 1]
    return "".join(lines)


def _root(text: str) -> MappingNode | None:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {str(e).splitlines()[0]}") from None
    if root is not None and not isinstance(root, MappingNode):
        raise ConfigError("the top level must be a mapping of keys (database, defaults, hosts, ...)")
    return root


def _section(root: MappingNode | None) -> tuple[Node, Node] | None:
    if root is None:
        return None
    return next(((k, v) for k, v in root.value if isinstance(k, ScalarNode) and k.value == SECTION), None)


def _names(section: MappingNode) -> list[str]:
    return [str(k.value) for k, _ in section.value]


def _is_empty(node: Node) -> bool:
    return (isinstance(node, ScalarNode) and node.tag == NULL_TAG) or (isinstance(node, MappingNode) and not node.value)


def _nested_indent(root: MappingNode | None) -> int:
    """How far the file indents a key under a top-level key (the first block mapping's), else 2."""
    for key, value in root.value if root is not None else ():
        if isinstance(value, MappingNode) and value.value and not value.flow_style:
            return max(1, value.value[0][0].start_mark.column - key.start_mark.column)
    return 2


def _last_line(node: Node) -> int:
    """The (0-based) line of the node's last character."""
    end = node.end_mark
    return end.line if end.column > 0 else end.line - 1


def _insert_after(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    if line < len(lines) and not lines[line].endswith("\n"):
        lines[line] += "\n"
    lines.insert(line + 1, new + "\n")
    return "".join(lines)


# -- the file ------------------------------------------------------------------------------------------------


def read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found (`receipts init` writes one)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config file: {e}") from None


def write(path: Path, text: str) -> ReceiptsConfig:
    """Validate the edited config, then put it in place of the file at once, with the file's permissions."""
    config = parse_config(text, source=str(path), base_dir=path.absolute().parent)
    fd, tmp = tempfile.mkstemp(dir=path.absolute().parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write the config: {e.strerror or e}") from None
    return config
