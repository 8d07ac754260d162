"""Reads counters with pylibmc and pymemcache as applications configure
them by default; used by client/readers_test.go.

usage: read_counters.py HOST:PORT KEY...

Prints one JSON object: for each client, for each key, [type, text] of
the value the client returned (None when missing).
"""
import json
import sys

import pylibmc
from pymemcache import serde
from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient


def describe(v):
    if v is None:
        return None
    if isinstance(v, bytes):
        return ["bytes", v.decode("ascii", "replace")]
    return [type(v).__name__, str(v)]


def main():
    server, keys = sys.argv[1], sys.argv[2:]
    host, port = server.rsplit(":", 1)
    clients = {
        "pylibmc": pylibmc.Client([server]),
        "pylibmc-binary": pylibmc.Client([server], binary=True),
        "pymemcache-hash": HashClient([(host, int(port))]),
        "pymemcache-pickle-serde": Client((host, int(port)), serde=serde.pickle_serde),
    }
    out = {}
    for name, mc in clients.items():
        out[name] = {k: describe(mc.get(k)) for k in keys}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
