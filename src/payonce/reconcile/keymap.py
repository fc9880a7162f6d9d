"""``--key-map FILE``: which provider API key or project each gateway tenant bills to.

The gateway logs a tenant as a hash of the caller's credential (``payonce
tenant-id`` prints it for a credential read from standard input); a provider's
usage report groups by the id of an API key (``key_…`` at OpenAI, ``apikey_…`` at
Anthropic) or of a project or workspace (``proj_…``, ``wrkspc_…``). The map joins
the two, so that each key's billed usage is compared with the calls of the
tenants that bill to it, and usage of keys the map does not name is reported as
spend of keys the gateway does not front.

The file is a JSON object from tenant id to provider id::

    {"34b90d089c91c03ce71d178372422d50": "key_5163be3ef077",
     "0f3a...": "key_5163be3ef077"}

Several tenants may share a key. Whether the ids name API keys or projects is
read from their prefixes (``proj_``/``wrkspc_`` are projects, anything else a
key); a map mixing both is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from payonce.errors import ConfigError

__all__ = ["KeyMap", "read_key_map"]

_PROJECT_PREFIXES = ("proj_", "wrkspc_")


@dataclass(frozen=True, slots=True)
class KeyMap:
    """Tenant id to provider id, and which column of a usage report the ids are in."""

    tenants: Mapping[str, str]
    column: str  # "api_key_id" or "project_id"

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.tenants.values())


def read_key_map(path: Path) -> KeyMap:
    """Read and check a ``--key-map`` file (bad input: a one-line ConfigError)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--key-map: {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--key-map: {path}: cannot read: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"--key-map: {path}: not JSON: {exc}") from exc
    if not isinstance(document, dict) or not document:
        raise ConfigError(
            f"--key-map: {path}: expected a JSON object from tenant id to API key or project id"
        )
    tenants: dict[str, str] = {}
    for tenant, target in document.items():
        if not isinstance(target, str) or not target or not tenant:
            raise ConfigError(
                f"--key-map: {path}: tenant {tenant!r}: expected a provider key or project id"
            )
        tenants[tenant] = target
    projects = {target.startswith(_PROJECT_PREFIXES) for target in tenants.values()}
    if len(projects) > 1:
        raise ConfigError(f"--key-map: {path}: mixes API key ids and project ids; map to one kind")
    return KeyMap(tenants, "project_id" if projects == {True} else "api_key_id")
