"""Key files made on first use (the HMAC secret, the audit signing key and its public half)."""

import os
from pathlib import Path

from proxy_addon.exceptions import ConfigError


def create_once(path: Path, content: bytes, mode: int, key_name: str) -> None:
    """Write `content` beside `path`, then link it into place: the file appears whole or not at all, so that
    replicas starting together never read a half-written key, and all of them use the one linked first (a file
    already there stands). `key_name`: the config key that names the file, for the one-line error."""
    draft = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.link(draft, path)
    except FileExistsError:
        pass  # another process linked its file first: that one stands
    except OSError as e:
        raise ConfigError(f"{key_name} {path}: cannot create it: {e.strerror}") from None
    finally:
        draft.unlink(missing_ok=True)
