"""The holder process of the paused-holder scenario (test_scenarios.py).

    python3 -S holder.py ENDPOINT LOCK TTL RESOURCE_URL

It takes LOCK through a session of TTL seconds, prints "token N", and
waits for a line on stdin (meanwhile the test stops it with SIGSTOP and
continues it). Then, as a holder that ran on, it says whether its grant is
lost ("lost True SessionLostError"), and sends its write to the resource
through the fencing middleware anyway, printing "status CODE BODY".
"""

import sys
import urllib.error
import urllib.request

import fence
from fence import fencing


def main() -> None:
    endpoint, lock, ttl, url = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    client = fence.Client(endpoints=[endpoint])
    session = client.session(ttl)
    grant = session.lock(lock).acquire()
    print("token", grant.token, flush=True)
    sys.stdin.readline()
    lost = grant.lost.is_set()
    print("lost", lost, type(grant.error).__name__, flush=True)
    req = urllib.request.Request(url, data=b"from the paused holder", method="PUT", headers=fencing.headers(grant))
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    print("status", status, body.decode().strip(), flush=True)
    session.close()


if __name__ == "__main__":
    main()
