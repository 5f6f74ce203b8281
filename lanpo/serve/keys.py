"""API keys of `lanpo serve`: who may call it, and which pools each caller may read.

- `--api-key KEY` (repeatable, or `LANPO_SERVE_API_KEY`): a key that may read every pool, named `key-1`, `key-2`...
- `--keys FILE`: a TOML file of named keys with the pools each may read, and the scopes (users, agents) it is
  bound to::

      [keys.alice]
      key = "sk-alice-..."
      pools = ["demo"]          # "*": every pool
      scopes = ["alice"]        # optional: its requests are in these scopes only (`lanpo.serve.scopes`)

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
from lanpo.serve.scopes import SCOPE_HINT, valid_scope

ALL_POOLS = "*"
MIN_KEY_LENGTH = 16


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the key's name (None: no keys configured), the pools it may read, and the scopes it is
    bound to (None: unbound, it may name any scope or none)."""

    name: str | None
    pools: frozenset[str]
    scopes: frozenset[str] | None = None

    def may_read(self, pool: str | None) -> bool:
        """Whether this caller may read `pool` (None: no pool, zero-shot only: everyone may)."""
        return pool is None or ALL_POOLS in self.pools or pool in self.pools


ANYONE = Caller(None, frozenset({ALL_POOLS}))


@dataclass(frozen=True)
class _Key:
    name: str
    digest: bytes
    pools: frozenset[str]
    scopes: frozenset[str] | None = None


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
        return None if found is None else Caller(found.name, found.pools, found.scopes)

    def names(self) -> list[str]:
        return [k.name for k in self._keys]


def _key(name: str, key: object, pools: object, where: str, scopes: object = None) -> _Key:
    if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH or key != key.strip():
        raise ConfigError(
            f"{where}: an API key must be a string of at least {MIN_KEY_LENGTH} characters without surrounding spaces",
            hint='make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"',
        )
    if not isinstance(pools, list) or not pools or not all(isinstance(p, str) and p.strip() for p in pools):
        raise ConfigError(
            f"{where}: pools must be a non-empty list of pool names", hint='e.g. pools = ["demo"], or ["*"] for all'
        )
    if scopes is not None:
        if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) for s in scopes):
            raise ConfigError(
                f"{where}: scopes must be a non-empty list of scope names", hint='e.g. scopes = ["alice"]'
            )
        bad = [s for s in scopes if not valid_scope(s)]
        if bad:
            raise ConfigError(f"{where}: {bad[0]!r} is not a scope name", hint=SCOPE_HINT)
    bound = None if scopes is None else frozenset(scopes)
    return _Key(name, hashlib.sha256(key.encode()).digest(), frozenset(pools), bound)


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
        if not isinstance(table, dict) or set(table) - {"key", "pools", "scopes"}:
            raise ConfigError(
                f"{path}: [keys.{name}] may set key, pools and scopes only", hint='pools = ["*"] reads all'
            )
        where = f"{path} [keys.{name}]"
        out.append(_key(name, table.get("key"), table.get("pools", [ALL_POOLS]), where, table.get("scopes")))
    return out


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only (`localhost`, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
