"""The open-file limit a server process needs: as many sockets as the system allows.

Every call in flight holds a socket in ``payonce sim`` and two in the gateway (the
client's and the upstream's). Shells and service managers often start programs
with a soft limit of 1024 while the hard limit is far higher; at the soft limit
the gateway could neither accept a client nor open an upstream connection (a 502,
or a reset). Like nginx's ``worker_rlimit_nofile`` and Go's runtime, both servers
raise their soft limit to the hard one at startup. The hard limit stays the
operator's to set (``ulimit -Hn``, systemd's ``LimitNOFILE``).
"""

from __future__ import annotations

import contextlib
import resource  # POSIX, as the gateway's workers and the store's locks are

__all__ = ["raise_open_files_limit"]

# When the hard limit is "unlimited": what Linux's default fs.nr_open allows.
_UNLIMITED_TARGET = 1 << 20


def raise_open_files_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; the soft limit now in force.

    A refusal (a hard limit the kernel will not grant) leaves the limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
