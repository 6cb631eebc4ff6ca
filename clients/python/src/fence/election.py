"""Leader election on a lock and a fenced record, as client/election.go.

The leader holds the lock ``"election/" + name``; its value is kept in the
fenced KV store under the same key, written with the leadership's token in
strict mode (a deposed leader cannot overwrite its successor's record) and
bound to the leader's session (it goes when the session ends). The token
is the leadership's fencing token: pass it with the leader's writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

from ._errors import (FenceError, InvalidArgument, LimitError, NotFound, NotHolder, PermissionDenied,
                      RevisionMismatch, StaleTokenError, Unauthenticated, WrongCluster)
from .locks import Mutex
from .session import Grant

if TYPE_CHECKING:
    from .client import Client
    from .kv import KeyValue
    from .session import Session


def election_key(name: str) -> str:
    """The lock, and the KV key, of the election name."""
    return "election/" + name


@dataclass(frozen=True)
class LeaderState:
    """An election's leader as Client.leader and Client.observe report it:
    ``elected`` is False while nobody leads."""

    elected: bool = False
    value: str = ""
    token: int = 0


class Election:
    """One session's part in the election name."""

    def __init__(self, session: "Session", name: str) -> None:
        self.session = session
        self.key = election_key(name)
        self._mutex = Mutex(session, self.key)

    @property
    def leadership(self) -> Optional[Grant]:
        """The leadership's grant while this session leads, else None."""
        return self._mutex.grant

    def campaign(self, value: str, timeout: Optional[float] = None) -> Grant:
        """Wait until this session leads, record value as the leader's, and
        return the leadership's grant. A campaign that fails after it was
        elected (the value could not be recorded) gives leadership up again
        (it deletes the record if the failed write may have made it, then
        releases the lock), so that the next campaigner is elected; if the
        service cannot be told, the session is given up instead. Campaigning
        while leading is proclaim."""
        held = self._mutex.grant
        g = self._mutex.acquire(timeout)
        try:
            self.proclaim(value)
        except FenceError as err:
            if g is not held:
                self._give_up(g, err)
            raise
        return g

    def proclaim(self, value: str) -> None:
        """Change the leader's value without giving up leadership; NotHolder
        when this session no longer leads."""
        g = self._mutex.grant
        if g is None:
            raise NotHolder(f"not the leader of {self.key}")
        self.session.client.kv.put(self.key, value, grant=g, strict=True, session=self.session)

    def resign(self) -> None:
        """Give up leadership: the record is deleted and the lock released,
        so the next campaigner is elected at once."""
        g = self._mutex.grant
        if g is None:
            return
        self.session.client.kv.delete(self.key, grant=g, strict=True)
        self._mutex.release()

    def _give_up(self, g: Grant, written: FenceError) -> None:
        s = self.session
        if s.error is not None:
            return  # the session's end releases everything
        try:
            if _may_have_applied(written):
                try:
                    s.client.kv.delete(self.key, grant=g, strict=True)
                except (NotHolder, StaleTokenError):
                    pass
            self._mutex.release()
        except NotHolder:
            pass
        except FenceError as err:
            s._give_up(f"{self.key!r} after a failed campaign", err)


def _may_have_applied(err: FenceError) -> bool:
    """Whether a write that failed with err may have been applied: it was
    not refused outright."""
    refused = (InvalidArgument, LimitError, PermissionDenied, Unauthenticated, NotHolder, StaleTokenError,
               RevisionMismatch, NotFound, WrongCluster)
    return not isinstance(err, refused)


def leader(client: "Client", name: str) -> LeaderState:
    """The election's leader, linearizably: nobody leads when there is no
    record, or its token is no longer the lock's current grant."""
    key = election_key(name)
    return _leader_of(client, key, client.kv.get(key))


def _leader_record(key: str, kv: "Optional[KeyValue]") -> bool:
    """Whether kv, the election key's value, is a leader's record: written
    under the election's lock (campaign, proclaim), and so, strictly
    fenced, by its holder at the time. A write no leader made (no fence,
    or another lock's) elects nobody."""
    return kv is not None and kv.lock == key and kv.token != 0


def _leader_of(client: "Client", key: str, kv: "Optional[KeyValue]") -> LeaderState:
    if kv is None or not _leader_record(key, kv) or not client.check(key, kv.token).current:
        return LeaderState()
    return LeaderState(True, kv.value.decode(), kv.token)


def observe(client: "Client", name: str) -> Iterator[LeaderState]:
    """The election's leader as it changes: first the current state, then
    each new leader, each proclaim and each loss of leadership. Close the
    iterator (or break out of the loop) to stop."""
    key = election_key(name)
    kvs, revision = client.kv.list(key)
    record = next((kv for kv in kvs if kv.key == key), None)
    last = _leader_of(client, key, record)
    yield last
    with client.kv.watch(key, start_revision=revision + 1) as w:
        for ev in w:
            if ev.kv.key != key:  # another election whose name starts with this one
                continue
            st = LeaderState()
            if ev.type == "put" and _leader_record(key, ev.kv):
                st = LeaderState(True, ev.kv.value.decode(), ev.kv.token)
            if st != last:
                last = st
                yield st
