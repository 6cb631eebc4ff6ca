"""Lock and unlock cycles per second of one Python client against a node.

    PYTHONPATH=clients/python/src python3 clients/python/bench.py \\
        --endpoints 127.0.0.1:7420 --seconds 10

One session, one lock, a loop of acquire and release: two calls, two raft
commits each cycle, as `fence bench --workload own --clients 1 --no-stream`
measures for the Go client (each operation a unary call of its own, as
this client sends them). Prints the rate and the p50 and p99 latency of one
cycle. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import time

import fence


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoints", default="127.0.0.1:7420", help="comma-separated host:port of the nodes")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to run")
    p.add_argument("--lock", default="bench/python", help="the lock's name")
    args = p.parse_args()

    c = fence.Client(endpoints=args.endpoints.split(","))
    with c.session(ttl=10) as s:
        m = s.lock(args.lock)
        m.acquire()  # warm up: connections made, the leader found
        m.release()
        cycles = []
        end = time.monotonic() + args.seconds
        while True:
            start = time.monotonic()
            if start >= end:
                break
            m.acquire()
            m.release()
            cycles.append(time.monotonic() - start)
    cycles.sort()
    n = len(cycles)
    print(f"{n / args.seconds:.0f} cycles/s over {args.seconds:g}s; "
          f"p50 {cycles[n // 2] * 1e3:.2f} ms, p99 {cycles[min(n - 1, n * 99 // 100)] * 1e3:.2f} ms")
    c.close()


if __name__ == "__main__":
    main()
