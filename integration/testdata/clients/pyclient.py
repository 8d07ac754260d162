#!/usr/bin/env python3
"""Writes or checks memcached items through a Python client library.

Usage: pyclient.py CLIENT MODE SERVERS < keys.json

CLIENT is one of:
  pylibmc                   pylibmc, default behaviours (modula, one-at-a-time)
  pylibmc-ketama            pylibmc, {"ketama": True}
  pylibmc-ketama-weighted   pylibmc, {"ketama_weighted": True}
  pymemcache                pymemcache HashClient (rendezvous, the default)
MODE is "seed" (store the starting items) or "check" (read them back and
report what each holds), or "locate" (print the server of each key, found
by storing a probe item and asking each server for it).
SERVERS is a comma-separated list of host:port.
Keys arrive on stdin as a JSON list of strings; the result is a JSON list
on stdout.
"""
import json
import socket
import sys


def make_client(name, servers):
    if name.startswith("pylibmc"):
        import pylibmc
        behaviors = {}
        if name == "pylibmc-ketama":
            behaviors = {"ketama": True}
        elif name == "pylibmc-ketama-weighted":
            behaviors = {"ketama_weighted": True}
        return pylibmc.Client(servers, behaviors=behaviors)
    if name == "pymemcache":
        from pymemcache.client.hash import HashClient
        return HashClient(servers, allow_unicode_keys=True)
    raise SystemExit("unknown client " + name)


def raw_get(server, key):
    host, port = server.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"get " + key.encode() + b"\r\n")
        buf = b""
        while not (buf.endswith(b"END\r\n")):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return buf.startswith(b"VALUE ")


GENERATION_KEY, GENERATION = "%gen:shop.items", "1782579200000000000"


def main():
    name, mode, servers = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    keys = json.load(sys.stdin)
    c = make_client(name, servers)
    out = []
    # Counters live under their table's generation (docs/formats.md,
    # "Generations"): the generation item and the counter at its key.
    if mode == "seed":
        c.set(GENERATION_KEY, GENERATION)
        for k in keys:
            c.set("ns:" + k, "1000")
            c.set("set:" + k, "+a ")
            c.set("cnt:" + k + "%@" + GENERATION, "5")
        out = len(keys)
    elif mode == "check":
        for k in keys:
            vals = []
            for item in ("ns:" + k, "set:" + k, "cnt:" + k + "%@" + GENERATION):
                v = c.get(item)
                if isinstance(v, bytes):
                    v = v.decode()
                elif v is not None:
                    v = str(v)
                vals.append(v)
            out.append(vals)
    elif mode == "locate":
        for k in keys:
            c.set("loc:" + k, "1")
            where = [i for i, s in enumerate(servers) if raw_get(s, "loc:" + k)]
            c.delete("loc:" + k)
            out.append(where[0] if len(where) == 1 else -1)
    json.dump(out, sys.stdout)


main()
