"""Scopes of `lanpo serve`: whose lessons a request reads, and whose its traffic writes.

A pool's lessons are shared by everyone who may read the pool; a lesson learned from a request that named a scope
(a user, an agent: mem0 scopes memories by user, agent and run, Letta puts the agent in the path) belongs to that
scope. A request reads its scope's lessons and the pool's shared ones, never another scope's.

- A request names its scope in the path (`/scopes/NAME/v1/...`, `/pools/POOL/scopes/NAME/v1/...`) or in its
  `lanpo` fields (`extra_body={"lanpo": {"scope": "NAME"}}`); naming two different ones is a 400.
- A key may be bound to scopes (`scopes = [...]` in `--keys FILE`): its requests are in one of them (a key bound to
  exactly one needs not name it), and a scope outside its binding looks unknown (404, as a pool it may not read).
  An unbound key names any scope, or none (the shared lessons only).
- A name is 1..128 letters, digits and `._:@-` (migration 0022 checks the same).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from lanpo.serve.http import ApiError

if TYPE_CHECKING:
    from lanpo.serve.keys import Caller

SCOPE_PATTERN = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
SCOPE_HINT = "a scope is 1-128 letters, digits and ._:@- (a user or agent id)"


def valid_scope(name: str) -> bool:
    return SCOPE_PATTERN.fullmatch(name) is not None


def request_scope(caller: Caller, in_path: str | None, in_body: str | None) -> str | None:
    """The scope a request is in: the one its path or `lanpo` fields name, else the key's only bound scope, else
    None (the pool's shared lessons only). ApiError: 400 for a malformed name or two names, 404 for a scope the key
    is not bound to, 400 for a key bound to several that names none."""
    for where, name in (("path", in_path), ("lanpo.scope", in_body)):
        if name is not None and not valid_scope(name):
            raise ApiError(400, f"{where}: {name[:64]!r} is not a scope name ({SCOPE_HINT})", "invalid_scope", "scope")
    if in_path is not None and in_body is not None and in_path != in_body:
        raise ApiError(400, f"the path names scope {in_path!r} and lanpo.scope {in_body!r}", "invalid_scope", "scope")
    named = in_path if in_path is not None else in_body
    bound = caller.scopes
    if bound is None:
        return named
    if named is None:
        if len(bound) == 1:
            return next(iter(bound))
        raise ApiError(400, "this key is bound to several scopes: name one", "scope_required", "scope")
    if named not in bound:
        raise ApiError(404, f"no scope {named!r} (or this key may not use it)", "scope_not_found", "scope")
    return named


def may_reach(caller: Caller, scope: str | None) -> bool:
    """Whether `caller` may reach an answer served in `scope` (feedback): an unbound key any; a bound key its own."""
    return caller.scopes is None or scope in caller.scopes
