"""A resource that refuses stale writers: a WSGI app behind the fencing
middleware, which answers a write whose Fence-Token is lower than one it
accepted 409, with the JSON body Go's fencing.Middleware sends.

    python3 examples/resource.py 8080
"""

import sys
from typing import Any, Callable, Dict, List
from wsgiref.simple_server import make_server

from fence import fencing

orders: Dict[str, bytes] = {}


def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> List[bytes]:
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    orders[environ["PATH_INFO"]] = body  # runs only for a current token
    start_response("204 No Content", [])
    return []


guarded = fencing.WSGIMiddleware(app, fencing.Guard())  # key: Fence-Lock, or the path

if __name__ == "__main__":
    make_server("127.0.0.1", int(sys.argv[1]), guarded).serve_forever()
