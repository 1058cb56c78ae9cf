"""Signed checkpoints: an Ed25519 signature over every receipt's history head at one moment.

The chain (chain.py) shows a history rewritten in its middle; it cannot show one cut short at its end, nor a
receipt deleted whole, since what is gone leaves no hash behind. A checkpoint can: it signs the sorted
[operation_id, head] list (its `root`), so that an auditor holding the public key alone, and a copy of the
database, can later tell which receipt lost rows or disappeared since (audit/verify.py). Each checkpoint also
names the one before it (`previous`: the digest of its signed document), so a checkpoint removed from the
middle shows too.

The signing key is made on first use, beside the config (`audit.signing_key_file`), mode 0600, with its
public key as `<signing_key_file>.pub` in PEM: that file is what an auditor is given.
"""

import base64
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proxy_addon.audit.chain import PREFIX, VERSION, canonical, timestamp
from proxy_addon.exceptions import ConfigError
from proxy_addon.keyfiles import create_once

KIND = "receipts.audit.checkpoint"


def heads_root(heads: Sequence[Sequence[str]]) -> str:
    """One hash over the sorted [operation_id, head] pairs, streamed (a journal may hold millions)."""
    hasher = hashlib.sha256()
    for operation_id, head in heads:
        hasher.update(f"{operation_id} {head}\n".encode())
    return PREFIX + hasher.hexdigest()


def document_digest(signed: str) -> str:
    """What the next checkpoint names as its `previous`."""
    return PREFIX + hashlib.sha256(signed.encode()).hexdigest()


def make_checkpoint(
    key: Ed25519PrivateKey, heads: list[list[str]], created_at: datetime, previous_signed: str | None, note: str | None
) -> dict[str, Any]:
    """The row of a new checkpoint (audit_checkpoints' columns but its id): the document, its signature, the
    public key that checks it."""
    root = heads_root(heads)
    document = {
        "v": VERSION,
        "kind": KIND,
        "created_at": timestamp(created_at),
        "receipts": len(heads),
        "root": root,
        "previous": None if previous_signed is None else document_digest(previous_signed),
        "note": note,
    }
    signed = canonical(document).decode()
    signature = base64.b64encode(key.sign(signed.encode())).decode()
    public_pem = public_key_pem(key.public_key())
    return {"created_at": created_at, "root": root, "heads": heads, "signed": signed, "signature": signature,
            "public_key": public_pem, "note": note}


def checkpoint_problem(
    public_key: Ed25519PublicKey, signed: str, signature: str, heads: list[list[str]], previous_signed: str | None
) -> str | None:
    """What is wrong with a stored checkpoint, checked with the public key alone, or None: its signature, its
    heads against the root it signed, and its link to the checkpoint before it."""
    try:
        public_key.verify(base64.b64decode(signature, validate=True), signed.encode())
    except (InvalidSignature, ValueError):
        return "its signature does not verify with this public key"
    try:
        document = json.loads(signed)
    except json.JSONDecodeError:
        return "its signed document is not JSON"
    if document.get("kind") != KIND:
        return "its signed document is not a receipts checkpoint"
    if heads_root(heads) != document.get("root") or len(heads) != document.get("receipts"):
        return "its stored heads are not the ones it signed"
    expected_previous = None if previous_signed is None else document_digest(previous_signed)
    if document.get("previous") != expected_previous:
        return "the checkpoint before it is missing or was changed"
    return None


# -- keys -------------------------------------------------------------------------------------------------------


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_or_create_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """The signing key at `path`, made on first use (mode 0600), its public key written beside it as `.pub`."""
    path = Path(path)
    if not path.exists():
        _create(path, Ed25519PrivateKey.generate())
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as e:
        raise ConfigError(f"audit.signing_key_file {path}: cannot read it: {e.strerror}") from None
    except (ValueError, TypeError):
        raise ConfigError(f"audit.signing_key_file {path}: not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"audit.signing_key_file {path}: not an Ed25519 key")
    public = Path(f"{path}.pub")
    if not public.exists():
        create_once(public, public_key_pem(key.public_key()).encode(), 0o644, "audit.signing_key_file")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """An auditor's public key file (PEM); bad input is one ConfigError line."""
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except OSError as e:
        raise ConfigError(f"--public-key {path}: cannot read it: {e.strerror}") from None
    except (ValueError, TypeError):
        raise ConfigError(f"--public-key {path}: not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"--public-key {path}: not an Ed25519 public key")
    return key


def _create(path: Path, key: Ed25519PrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    create_once(path, pem, 0o600, "audit.signing_key_file")
