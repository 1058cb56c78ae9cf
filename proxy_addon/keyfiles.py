"""Key files made on first use (the HMAC secret, the audit signing key and its public half)."""

import os
from pathlib import Path

from proxy_addon.exceptions import ConfigError

SECRET_ENV = "RECEIPTS_SECRET"  # the HMAC secret itself, instead of secret_file (every replica given the same one)


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


def load_or_create_key(path: str | Path) -> bytes:
    """The HMAC key of the account hash and the secrets' digests (rules/account.py): `RECEIPTS_SECRET`, else
    `secret_file`, made on first use."""
    env = os.environ.get(SECRET_ENV)
    if env:
        return env.encode()
    path = Path(path)
    if not path.exists():
        create_once(path, os.urandom(32).hex().encode(), 0o600, "secret_file")
    try:
        key = path.read_text().strip()
    except OSError as e:
        raise ConfigError(f"secret_file {path}: cannot read it: {e.strerror}") from None
    if len(key) < 32:
        raise ConfigError(f"secret_file {path}: too short to be a key (want 32+ characters)")
    return key.encode()
