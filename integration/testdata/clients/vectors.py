#!/usr/bin/env python3
"""Generates itemformat/testdata/distribution-vectors.json: for each client
configuration, the server each key is stored on, found by storing the key
through the real client and asking every server for it.

Usage: vectors.py SERVERS > distribution-vectors.json
SERVERS: comma-separated host:port of three running, empty memcached
servers; one on port 11211 exercises libmemcached's rule that leaves the
default port out of a server's point names.
"""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
servers = sys.argv[1].split(",")

ascii_keys = ["shop:ns:user:%d" % i for i in range(150)]
ascii_keys += ["interests:%d" % (i * 7919) for i in range(50)]
ascii_keys += ["k%%20%d:{x}|~!" % i for i in range(20)]
ascii_keys += ["long:" + "x" * (190 + i) for i in range(10)]
unicode_keys = ["ключ:%d" % i for i in range(20)] + ["日本語:%d" % i for i in range(20)]
unicode_keys += ["é%d" % i for i in range(10)] + ["\U0001F600:%d" % i for i in range(10)]

configs = [
    # client, script, distribution, weights, unicode keys accepted
    ("pylibmc", "py", "modula-oaat", None, True),
    ("pylibmc-ketama", "py", "libmemcached-consistent", None, True),
    ("pylibmc-ketama-weighted", "py", "ketama", None, True),
    ("pymemcache", "py", "rendezvous", None, True),
    ("php-memcached", "php", "modula-oaat", None, False),
    ("php-memcached-ketama", "php", "ketama", None, False),
    ("php-memcached-consistent", "php", "libmemcached-consistent", None, False),
    ("php-memcached-ketama", "php", "ketama", [1, 2, 5], False),
]

out = []
for client, script, dist, weights, unicode_ok in configs:
    keys = ascii_keys + (unicode_keys if unicode_ok else [])
    spec = servers
    if weights:
        spec = ["%s/%d" % (s, w) for s, w in zip(servers, weights)]
    if script == "py":
        cmd = [sys.executable, os.path.join(here, "pyclient.py")]
    else:
        cmd = ["php", os.path.join(here, "phpclient.php")]
    res = subprocess.run(cmd + [client, "locate", ",".join(spec)],
                         input=json.dumps(keys), capture_output=True, text=True, check=True)
    where = json.loads(res.stdout)
    if any(w < 0 for w in where):
        raise SystemExit("%s: some keys were not stored on exactly one server" % client)
    out.append({
        "client": client,
        "distribution": dist,
        "servers": [{"addr": s, "weight": (weights[i] if weights else 1)} for i, s in enumerate(servers)],
        "keys": ["loc:" + k for k in keys],
        "server": where,
    })
json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
print()
