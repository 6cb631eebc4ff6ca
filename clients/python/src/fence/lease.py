"""Leases: a lock in one call, for a program that cannot keep a session
alive (a cron job, a serverless function), as client/lease.go.

Nothing renews a lease in the background and nothing tells its holder that
it lapsed: the holder renews before ``safe_until`` and stops acting on the
lock once it has passed. Send ``token`` with every write.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Dict

from . import _wire
from ._errors import InvalidArgument

if TYPE_CHECKING:
    from .client import Client


class Lease:
    """A lease on a lock: its ``token``, ``id`` and ``secret`` (keep it as a
    password: it renews and releases the lease). Use as a context manager
    to release it on exit. Safe for use by several threads."""

    def __init__(self, client: "Client", lease_id: int, secret: str, *, drift: float = 0.01,
                 margin: float = 0.1) -> None:
        """Resume a lease by its id and secret (a program's next run);
        Client.lease takes a new one."""
        if not lease_id or not secret:
            raise InvalidArgument("a lease needs its id and secret, as Client.lease answered them")
        if not 0 <= drift < 1 or margin < 0:
            raise InvalidArgument("drift must be in [0, 1) and margin not negative")
        self._client = client
        self.id, self.secret = lease_id, secret
        self._drift, self._margin = drift, margin
        self._mu = threading.Lock()
        self.lock = ""
        self.token = 0
        self.ttl = 0.0
        self._safe_until = 0.0

    @property
    def safe_until(self) -> float:
        """The instant (time.monotonic()) until which the lease is known to
        hold: sent + ttl * (1 - drift) - margin of the last renewal; 0 for a
        resumed lease not yet renewed."""
        with self._mu:
            return self._safe_until

    def _renewed(self, sent: float, resp: Dict[str, Any]) -> None:
        with self._mu:
            self.lock = resp.get("lock", self.lock)
            self.token = _wire.u64(resp, "token") or self.token
            self.ttl = _wire.seconds(resp.get("ttl"))
            self._safe_until = max(self._safe_until, sent + self.ttl * (1 - self._drift) - self._margin)

    def renew(self) -> None:
        """Renew the lease for its TTL; NotFound once it has expired."""
        self._call("RenewLease")

    def release(self) -> bool:
        """Release the lease and its lock at once; False when it had ended
        already (expired, revoked, or released by an earlier call)."""
        return bool(self._call("ReleaseLease").get("released"))

    def _call(self, method: str) -> Dict[str, Any]:
        sent = [0.0]
        tr = self._client._transport
        body = {"leaseId": str(self.id), "leaseSecret": self.secret}

        def call(ep: Any, t: float) -> Dict[str, Any]:
            sent[0] = time.monotonic()
            return tr.attempt(ep, "fence.v1.LockService/" + method, body, t)
        resp = tr.call(call)
        if method == "RenewLease":
            self._renewed(sent[0], resp)
        return resp

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def take(client: "Client", lock: str, ttl: float, *, lock_delay: float = 0.0, owner: str = "",
         drift: float = 0.01, margin: float = 0.1) -> Lease:
    """Take lock for ttl seconds in one call, or raise LockedError at once.
    The lease's secret is drawn here and sent with the call, so that a retry
    after an attempt whose answer was lost is answered the lease that
    attempt took."""
    req: Dict[str, Any] = {"lock": lock, "ttl": _wire.duration(ttl), "owner": owner,
                           "leaseSecret": secrets.token_urlsafe(32)}
    if lock_delay > 0:
        req["lockDelay"] = _wire.duration(lock_delay)
    sent = [0.0]
    tr = client._transport

    def call(ep: Any, t: float) -> Dict[str, Any]:
        sent[0] = time.monotonic()
        try:
            return tr.attempt(ep, "fence.v1.LockService/Lease", req, t)
        except InvalidArgument as err:
            if "leaseSecret" not in req or 'unknown field "leaseSecret"' not in str(err):
                raise
        # A node from before caller-drawn secrets (a group being upgraded)
        # refuses the field in JSON: it draws the secret itself.
        del req["leaseSecret"]
        sent[0] = time.monotonic()
        return tr.attempt(ep, "fence.v1.LockService/Lease", req, t)
    resp = tr.call(call)
    lease = Lease(client, _wire.u64(resp, "leaseId"), resp.get("leaseSecret", ""), drift=drift, margin=margin)
    lease._renewed(sent[0], resp)
    return lease
