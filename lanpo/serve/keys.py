"""API keys of `lanpo serve`: who may call it, and which pools each caller may read.

- `--api-key KEY` (repeatable, or `LANPO_SERVE_API_KEY`): a key that may read every pool, named `key-1`, `key-2`...
- `--keys FILE`: a TOML file of named keys with the pools each may read::

      [keys.alice]
      key = "sk-alice-..."
      pools = ["demo"]          # "*": every pool

With no key at all the server answers anyone, which `lanpo serve` allows on a loopback address only. Keys are
compared by their SHA-256 digests in constant time; only a key's name reaches the store and the logs.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import tomllib
from dataclasses import dataclass
from pathlib import Path

from lanpo.errors import ConfigError

ALL_POOLS = "*"
MIN_KEY_LENGTH = 16


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the key's name (None: no keys configured) and the pools it may read."""

    name: str | None
    pools: frozenset[str]

    def may_read(self, pool: str | None) -> bool:
        """Whether this caller may read `pool` (None: no pool, zero-shot only: everyone may)."""
        return pool is None or ALL_POOLS in self.pools or pool in self.pools


ANYONE = Caller(None, frozenset({ALL_POOLS}))


@dataclass(frozen=True)
class _Key:
    name: str
    digest: bytes
    pools: frozenset[str]


class KeyRing:
    """The configured keys; `caller(token)` is the Caller a bearer token names, or None for a wrong key."""

    def __init__(self, keys: list[_Key]) -> None:
        self._keys = keys

    @classmethod
    def build(cls, api_keys: tuple[str, ...] = (), keys_file: Path | None = None) -> KeyRing:
        keys = [_key(f"key-{i}", k, [ALL_POOLS], "--api-key") for i, k in enumerate(api_keys, 1)]
        if keys_file is not None:
            keys.extend(_read_keys_file(keys_file))
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            raise ConfigError("two API keys share a name", hint="give each [keys.NAME] table its own NAME")
        digests = [k.digest for k in keys]
        if len(set(digests)) != len(digests):
            raise ConfigError("the same API key is given twice", hint="each caller gets a key of its own")
        return cls(keys)

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def caller(self, token: str | None) -> Caller | None:
        if not self._keys:
            return ANYONE
        if not token:
            return None
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for key in self._keys:  # every key compared, in constant time: no timing tells which prefix matched
            if hmac.compare_digest(key.digest, digest):
                found = key
        return None if found is None else Caller(found.name, found.pools)

    def names(self) -> list[str]:
        return [k.name for k in self._keys]


def _key(name: str, key: object, pools: object, where: str) -> _Key:
    if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH or key != key.strip():
        raise ConfigError(
            f"{where}: an API key must be a string of at least {MIN_KEY_LENGTH} characters without surrounding spaces",
            hint='make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"',
        )
    if not isinstance(pools, list) or not pools or not all(isinstance(p, str) and p.strip() for p in pools):
        raise ConfigError(
            f"{where}: pools must be a non-empty list of pool names", hint='e.g. pools = ["demo"], or ["*"] for all'
        )
    return _Key(name, hashlib.sha256(key.encode()).digest(), frozenset(pools))


def _read_keys_file(path: Path) -> list[_Key]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"keys file {path} does not exist", hint="pass a TOML file of [keys.NAME] tables") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"keys file {path} cannot be read: {exc}", hint="it is TOML: [keys.NAME] key = ..."
        ) from None
    tables = data.get("keys")
    if not isinstance(tables, dict) or not tables or set(data) != {"keys"}:
        raise ConfigError(
            f"keys file {path} must hold only [keys.NAME] tables", hint='[keys.alice] key = "..." pools = ["demo"]'
        )
    out = []
    for name, table in tables.items():
        if not isinstance(table, dict) or set(table) - {"key", "pools"}:
            raise ConfigError(f"{path}: [keys.{name}] may set key and pools only", hint='pools = ["*"] reads all')
        out.append(_key(name, table.get("key"), table.get("pools", [ALL_POOLS]), f"{path} [keys.{name}]"))
    return out


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only (`localhost`, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
