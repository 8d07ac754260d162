"""Reads what cachewarden keeps in memcached, following docs/formats.md.

A small reader for Python applications on pymemcache (Debian's
python3-pymemcache): keys built like the daemon's, namespace versions,
hot-key copies, master namespaces with evidence, sets and counters (each
read with its table's generation: members(mc, key, generation_key(prefix,
db, table))),
GetOrCompute's leases over the meta protocol (on a
socket of its own: pymemcache 3.x has no meta commands), and the source
positions that fills from a replica wait for (wait_for_position).

    from pymemcache.client.base import Client
    import cachewarden_reader as cw

    mc = Client(("127.0.0.1", 11211))
    ns = cw.key("shop:", "ns:user:{id}", {"id": 42})
    version = cw.namespace(mc, ns)

As a program it checks itself against the shared test vectors
(--vectors FILE), or answers JSON requests read line by line from stdin
(--server HOST:PORT), which is how client/readers_test.go compares it with
the Go client.
"""

import argparse
import hashlib
import json
import math
import random
import re
import socket
import sys
import time
import zlib

MAX_KEY = 250
HASHED_HEAD = 200
# The daemon's marks: '%' followed by anything but two upper-case hex
# digits, which no rendered key holds (docs/formats.md, Keys).
HASH_MARK = b"%#"
COPY_MARK = b"%copy"
_PLACEHOLDER = re.compile(rb"\{([^{}]+)\}")


def _text(value):
    """The text of a row value, as bytes: integers as decimal digits,
    booleans as 1/0, strings as their UTF-8 bytes."""
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        raise ValueError("NULL makes no key")
    raise TypeError("unsupported value type %s" % type(value).__name__)


def escape(raw):
    """Escapes bytes as keys and members are: <= 0x20, 0x7f and % become %XX."""
    out = bytearray()
    for b in raw:
        if b <= 0x20 or b == 0x7F or b == 0x25:
            out += b"%%%02X" % b
        else:
            out.append(b)
    return bytes(out)


def unescape(escaped):
    """Reverses escape: %XX (either case) becomes that byte."""
    out = bytearray()
    i = 0
    while i < len(escaped):
        c = escaped[i]
        if c == 0x25 and _ishex(escaped[i + 1:i + 3]):
            out.append(int(escaped[i + 1:i + 3], 16))
            i += 3
            continue
        out.append(c)
        i += 1
    return bytes(out)


def _ishex(two):
    return len(two) == 2 and all(chr(b) in "0123456789abcdefABCDEF" for b in two)


def finish_key(key):
    """Applies the 250-byte rule to a complete key (bytes)."""
    if len(key) <= MAX_KEY:
        return key
    return key[:HASHED_HEAD] + HASH_MARK + hashlib.sha256(key).hexdigest()[:32].encode()


def rendered(prefix, template, values):
    """Prefix and template rendered for a row's values, before the
    250-byte rule."""
    if isinstance(prefix, str):
        prefix = prefix.encode("utf-8")
    if isinstance(template, str):
        template = template.encode("utf-8")

    def sub(m):
        return escape(_text(values[m.group(1).decode("utf-8")]))

    return prefix + _PLACEHOLDER.sub(sub, template)


def key(prefix, template, values):
    """The memcached key (bytes) of a key template for a row's values."""
    return finish_key(rendered(prefix, template, values))


def copy_key(prefix, template, values, i):
    """The key of copy i of a namespace kept in copies (hot keys)."""
    return finish_key(rendered(prefix, template, values) + COPY_MARK + b"%d" % i)


def evidence_bit(entity_id, bits):
    """The bit of an entity id (its text) in an evidence bitmap."""
    text = _text(entity_id)
    digits = text[1:] if text[:1] == b"-" else text
    if digits and digits.isdigit():
        r = 0
        for d in digits:
            r = (r * 10 + d - 0x30) % bits
        return r
    return zlib.crc32(text) % bits


def decode_master(value, bits):
    """A master item: (version, bitmap bytes), or ValueError."""
    parts = value.rstrip(b" ").split(b" ")
    if len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) > MAX_VERSION or len(parts[1]) != bits // 4 \
            or parts[1] != parts[1].lower() or not all(chr(c) in "0123456789abcdef" for c in parts[1]):
        raise ValueError("%r is not a master item of %d bits" % (value, bits))
    return int(parts[0]), bytes.fromhex(parts[1].decode())


def has_bit(bitmap, b):
    return bitmap[b // 8] & (0x80 >> (b % 8)) != 0


def namespace_start(unix_ms):
    """The version a namespace created at unix_ms starts at."""
    return max(unix_ms, 0) << 20


MAX_VERSION = 2**64 - 1
MAX_COUNT = 2**63 - 1


def parse_version(value):
    """A namespace version (unsigned 64-bit; ASCII spaces, tabs, CR and LF
    around it ignored), or ValueError."""
    text = value.strip(b" \t\r\n")
    if not text.isdigit() or int(text) > MAX_VERSION:
        raise ValueError("%r is not a version" % value)
    return int(text)


def parse_count(value):
    """A counter (trailing spaces ignored, at most 2^63-1), or None when
    the item is not a count."""
    text = value.rstrip(b" ")
    return int(text) if text.isdigit() and int(text) <= MAX_COUNT else None


def _tokens(value):
    token = bytearray()
    for b in value + b" ":
        if b <= 0x20 or b == 0x7F:
            if token:
                yield bytes(token)
                token = bytearray()
        else:
            token.append(b)


def generation_key(prefix, database, table):
    """The key of a table's generation item: prefix, "gen:", the escaped
    database and "." when there is one, the escaped table."""
    if isinstance(prefix, str):
        prefix = prefix.encode("utf-8")
    db = escape(_text(database)) + b"." if database else b""
    return finish_key(prefix + b"%gen:" + db + escape(_text(table)))


def parse_generation(value):
    """A generation (as a namespace version), or ValueError."""
    return parse_version(value)


def counter_key(k, generation):
    """The key of the counter at key k under a generation."""
    return finish_key(k + b"%%@%d" % generation)


def _generation_token(tok):
    if len(tok) < 2 or tok[:1] != b"g" or not tok[1:].isdigit() or int(tok[1:]) > MAX_VERSION:
        return None
    return int(tok[1:])


def decode_set(value):
    """The members of a set item, escaped as its tokens spell them, in
    order, its token and garbage counts, and the generation of its
    leading generation token (None when it has none)."""
    order, present = [], {}
    tokens = 0
    generation = None
    for i, tok in enumerate(_tokens(value)):
        if i == 0 and _generation_token(tok) is not None:
            generation = _generation_token(tok)
            continue
        tokens += 1
        op, member = tok[:1], tok[1:]
        if op == b"+":
            if present.get(member, -1) < 0:
                present[member] = len(order)
                order.append(member)
        elif op == b"-":
            if member in present:
                present[member] = -1
    members = [m for i, m in enumerate(order) if present[m] == i]
    return members, tokens, tokens - len(members), generation


def encode_set(escaped_members, generation=None):
    """The compact item holding exactly the (escaped) members, after the
    generation token when there is a generation."""
    head = b"" if generation is None else b"g%d " % generation
    return head + b"".join(b"+" + m + b" " for m in escaped_members)


def namespace(mc, k, ttl=0, attempts=3):
    """The version at key k, created with the namespace start when missing."""
    for _ in range(attempts):
        value = mc.get(k)
        if value is not None:
            return parse_version(value)
        start = namespace_start(int(time.time() * 1000))
        if mc.add(k, str(start).encode(), expire=_at_least(ttl), noreply=False):
            return start
    raise RuntimeError("namespace %r evicted %d times in a row" % (k, attempts))


def hot_namespace(mc, prefix, template, values, copies, ttl=0):
    """The version of a namespace kept in copies, read from one at random."""
    return namespace(mc, copy_key(prefix, template, values, random.randrange(copies)), ttl)


def evidence_namespaces(mc, prefix, template, column, master_key, bits, rows, ttl=0):
    """The versions (text) of the namespaces of rows under a master with
    evidence: "m" + the master version for entities whose bit is clear,
    their own namespace's version otherwise."""
    for _ in range(3):
        value, cas = mc.gets(master_key)
        try:
            version, bitmap = decode_master(value, bits) if value is not None else (None, None)
        except ValueError:
            version = None
        if version is not None:
            break
        fresh = b"%d %s" % (namespace_start(int(time.time() * 1000)), b"0" * (bits // 4))
        stored = mc.add(master_key, fresh, expire=_at_least(ttl), noreply=False) if value is None \
            else mc.cas(master_key, fresh, cas, expire=_at_least(ttl), noreply=False)
        if stored:
            version, bitmap = decode_master(fresh, bits)
            break
    else:
        raise RuntimeError("master %r changed or evicted 3 times in a row" % master_key)
    out = []
    for row in rows:
        if has_bit(bitmap, evidence_bit(row[column], bits)):
            out.append(str(namespace(mc, key(prefix, template, row), ttl)))
        else:
            out.append("m%d" % version)
    return out


def _generation(items, gk):
    value = items.get(gk)
    if value is None:
        return None
    try:
        return parse_generation(value)
    except ValueError:
        return None


def members(mc, k, gk):
    """The members of the set at key k, or None when it is missing or not
    of the current generation of its table (generation item gk), read
    together in one round trip."""
    items = mc.get_many([k, gk])
    generation, value = _generation(items, gk), items.get(k)
    if generation is None or value is None:
        return None
    escaped, _, _, stamped = decode_set(value)
    if stamped != generation:
        return None
    return [unescape(m) for m in escaped]


# The generation last read per generation key, so that a counter is read
# with its generation in one round trip while the generation stays.
_last_generation = {}


def count(mc, k, gk):
    """The counter at key k under the current generation of its table
    (generation item gk), or None when missing or not a count."""
    keys = [gk]
    guess = _last_generation.get(gk)
    if guess is not None:
        keys.append(counter_key(k, guess))
    items = mc.get_many(keys)
    generation = _generation(items, gk)
    if generation is None:
        return None
    _last_generation[gk] = generation
    if generation == guess:
        value = items.get(counter_key(k, generation))
    else:
        value = mc.get(counter_key(k, generation))
    return None if value is None else parse_count(value)


class MetaConn:
    """One connection speaking memcached's meta protocol, which pymemcache
    (3.x) does not: GetOrCompute's leases go over it. Connect it to the
    server that holds the key (the daemon's distribution decides which)."""

    def __init__(self, host, port, timeout=2):
        self.sock = socket.create_connection((host, port), timeout)
        self.rfile = self.sock.makefile("rb")

    def command(self, line, data=None):
        """Sends one command and returns its reply line's words and the
        value of a VA reply."""
        out = line + b"\r\n"
        if data is not None:
            out += data + b"\r\n"
        self.sock.sendall(out)
        words = self.rfile.readline().split()
        if not words:
            raise ConnectionError("memcached closed the connection")
        if words[0] == b"VA":
            value = self.rfile.read(int(words[1]) + 2)[:-2]
            return words, value
        if words[0] in (b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR"):
            raise RuntimeError(b" ".join(words).decode())
        return words, None


MAX_RELATIVE_EXPTIME = 30 * 24 * 3600


def _at_least(seconds):
    """The exptime of an item that must live at least this many seconds:
    memcached's clock ticks in whole seconds and ends an item of n seconds
    after n-1 to n of them, so one more (0: no expiry). Beyond 30 days
    memcached takes an exptime as a Unix time."""
    if seconds <= 0:
        return 0
    n = math.ceil(seconds) + 1
    return n + int(time.time()) if n > MAX_RELATIVE_EXPTIME else n


def lease_get(k, compute_time):
    """The mg of one GetOrCompute look (docs/formats.md)."""
    ct = math.ceil(compute_time)
    return b"mg %s v c t N%d R%d" % (k, _at_least(ct), ct)


def stored_ttl(lifetime, compute_time):
    """The exptime of a computed value: at least its lifetime plus the
    compute time; 0 (no T flag) when the lifetime is 0 (never expires)."""
    return _at_least(lifetime + math.ceil(compute_time)) if lifetime > 0 else 0


def invalidate(k, stale_for):
    """The md that marks a value stale for at least stale_for seconds."""
    return b"md %s I T%d" % (k, _at_least(stale_for))


def get_or_compute(meta, k, lifetime, compute, compute_time=2, wait=0.05, max_wait=2.0):
    """GetOrCompute's protocol (docs/formats.md): one reader computes a
    missing, due or stale value while the others wait or are served it.
    The winner stores only over the item its lease is on (C<cas>); when
    that item changed or ended meanwhile, the value is returned but not
    stored."""
    deadline = time.time() + max_wait
    while True:
        words, value = meta.command(lease_get(k, compute_time))
        flags = {w[:1]: w[1:] for w in words[2:]}
        if b"W" in flags:
            new = compute()
            ttl = stored_ttl(lifetime, compute_time)
            line = b"ms %s %d C%s" % (k, len(new), flags[b"c"])
            if ttl:
                line += b" T%d" % ttl
            meta.command(line, new)  # HD, or EX/NF: not stored, never added
            return new
        if value is not None and (value or b"Z" not in flags):
            return value
        if time.time() >= deadline:
            raise TimeoutError("value of %r is being computed elsewhere" % k)
        time.sleep(wait)


POSITION_MARK = b"%pos:"
_MAX_POSITION_GTIDS = 64
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def position_key(server_id):
    """The key of the position item of the source server server_id."""
    return POSITION_MARK + str(server_id).encode()


def _digits(s):
    return s != "" and all("0" <= c <= "9" for c in s)


def parse_gtid(s):
    """One GTID: MariaDB's (domain, server, seq) or MySQL's (uuid, n);
    raises ValueError for anything else."""
    if ":" in s:
        uuid, n = s.split(":", 1)
        uuid = uuid.lower()
        if not _UUID.match(uuid) or not _digits(n) or int(n) == 0 or int(n) >= 1 << 64:
            raise ValueError("not a GTID: %r" % s)
        return (uuid, int(n))
    parts = s.split("-")
    if len(parts) != 3 or not all(_digits(p) for p in parts):
        raise ValueError("not a GTID: %r" % s)
    d, srv, n = (int(p) for p in parts)
    if d >= 1 << 32 or srv >= 1 << 32 or n >= 1 << 64:
        raise ValueError("not a GTID: %r" % s)
    return (d, srv, n)


def _stream(g):
    return (1, g[0]) if len(g) == 2 else (0, g[0])


def decode_position(value):
    """A position item's value: {"gtids": [GTID...] sorted, "binlog":
    (file, offset) or None}; raises ValueError when a gtid= or binlog= token
    does not parse."""
    gtids, binlog = [], None
    for tok in value.decode("ascii", "replace").split():
        if tok.startswith("gtid="):
            entries = tok[5:].split(",")
            if len(entries) > _MAX_POSITION_GTIDS:
                raise ValueError("too many GTIDs")
            for e in entries:
                g = parse_gtid(e)
                if any(_stream(h) == _stream(g) for h in gtids):
                    raise ValueError("two GTIDs of one stream: %r" % e)
                gtids.append(g)
        elif tok.startswith("binlog="):
            f, sep, off = tok[7:].rpartition(":")
            if not sep or not f or not _digits(off):
                raise ValueError("binlog %r is not file:offset" % tok[7:])
            binlog = (f, int(off))
    gtids.sort(key=_stream)
    return {"gtids": gtids, "binlog": binlog}


def _gtid_text(g):
    return "%s:%d" % g if len(g) == 2 else "%d-%d-%d" % g


def encode_position(pos):
    parts = []
    if pos["gtids"]:
        parts.append("gtid=" + ",".join(_gtid_text(g) for g in pos["gtids"]))
    if pos["binlog"]:
        parts.append("binlog=%s:%d" % pos["binlog"])
    return " ".join(parts).encode()


def replica_wait(pos, max_wait):
    """The statement that waits until a replica has applied pos, at most
    max_wait seconds: (function, query with ? placeholders, args), or None
    when pos gives no wait."""
    gtids = pos["gtids"]
    if gtids:
        mysql = len(gtids[0]) == 2
        if any((len(g) == 2) != mysql for g in gtids):
            return None
        if mysql:
            return ("WAIT_FOR_EXECUTED_GTID_SET", "SELECT WAIT_FOR_EXECUTED_GTID_SET(?, ?)",
                    [",".join("%s:1-%d" % g for g in gtids), max_wait])
        return ("MASTER_GTID_WAIT", "SELECT MASTER_GTID_WAIT(?, ?)",
                [",".join(_gtid_text(g) for g in gtids), max_wait])
    if pos["binlog"]:
        f, off = pos["binlog"]
        return ("MASTER_POS_WAIT", "SELECT MASTER_POS_WAIT(?, ?, ?)", [f, off + 1, max_wait])
    return None


def wait_outcome(function, result):
    """What the wait's single result (None for NULL) says: "reached",
    "timed_out" or "unusable"."""
    if result is None:
        return "unusable"
    try:
        n = int(str(result).strip())
    except ValueError:
        return "unusable"
    if function == "MASTER_GTID_WAIT":
        return {0: "reached", -1: "timed_out"}.get(n, "unusable")
    if function == "WAIT_FOR_EXECUTED_GTID_SET":
        return {0: "reached", 1: "timed_out"}.get(n, "unusable")
    if function == "MASTER_POS_WAIT":
        return "reached" if n >= 0 else "timed_out" if n == -1 else "unusable"
    return "unusable"


def wait_for_position(mc, server_id, cursor, max_wait=1.0, paramstyle="format"):
    """Before a fill from a replica (docs/formats.md, "Source positions"):
    reads the position item of the replica's source server_id and waits on
    cursor (a DB-API cursor of the connection the fill then uses) until the
    replica has applied it. Returns "reached", "timed_out" (read the
    primary, or store the result briefly) or "unfenced" (no usable
    position, or a replica that cannot wait for it: fill as before).
    paramstyle "format" sends %s placeholders (PyMySQL, mysqlclient,
    mysql-connector), "qmark" ?."""
    value = mc.get(position_key(server_id))
    if value is None:
        return "unfenced"
    try:
        w = replica_wait(decode_position(value), max_wait)
    except ValueError:
        return "unfenced"
    if w is None:
        return "unfenced"
    function, query, args = w
    if paramstyle != "qmark":
        query = query.replace("?", "%s")
    cursor.execute(query, args)
    row = cursor.fetchone()
    outcome = wait_outcome(function, None if row is None else row[0])
    return "unfenced" if outcome == "unusable" else outcome


def check_vectors(path):
    """Checks this reader against the shared test vectors; returns the
    failures."""
    with open(path, encoding="utf-8") as f:
        v = json.load(f)
    bad = []
    for case in v["keys"]:
        got = key(case["prefix"], case["template"], case["values"])
        if got != case["key"].encode("utf-8"):
            bad.append("key %s: %r != %r" % (case["name"], got, case["key"]))
    for case in v["tokens"]:
        got = (b"+" if case["add"] else b"-") + escape(case["member"].encode()) + b" "
        if got != case["token"].encode():
            bad.append("token %r: %r" % (case["member"], got))
    for case in v["sets"]:
        escaped, tokens, garbage, generation = decode_set(case["value"].encode())
        got = [unescape(m) for m in escaped]
        want = [m.encode() for m in case["members"]]
        want_generation = int(case["generation"]) if "generation" in case else None
        if got != want or tokens != case["tokens"] or garbage != case["garbage"] or generation != want_generation:
            bad.append("set %s: %r %d %d %r" % (case["name"], got, tokens, garbage, generation))
        if encode_set(escaped, generation) != case["compacted"].encode():
            bad.append("set %s compacted: %r" % (case["name"], encode_set(escaped, generation)))
    for case in v.get("generations", []):
        got = generation_key(case["prefix"], case["database"], case["table"])
        if got != case["key"].encode():
            bad.append("generation key %r: %r" % (case["key"], got))
    for case in v.get("counter_keys", []):
        got = counter_key(case["key"].encode(), int(case["generation"]))
        if got != case["counter_key"].encode():
            bad.append("counter key %r: %r" % (case["counter_key"], got))
    for case in v["namespaces"]:
        try:
            got = str(parse_version(case["value"].encode()))
        except ValueError:
            got = None
        if (got is not None) != case["valid"] or (got is not None and got != case["version"]):
            bad.append("namespace %r: %r" % (case["value"], got))
    for case in v["namespace_start"]:
        if str(namespace_start(case["unix_ms"])) != case["start"]:
            bad.append("namespace start %d" % case["unix_ms"])
    for case in v["counters"]:
        got = parse_count(case["value"].encode())
        if (got is not None) != case["valid"] or (got is not None and str(got) != case["count"]):
            bad.append("counter %r: %r" % (case["value"], got))
    for case in v["copy_keys"]:
        got = copy_key(case["prefix"], case["template"], case["values"] or {}, case["copy"])
        if got != case["key"].encode():
            bad.append("copy key %r: %r" % (case["key"], got))
    for case in v["evidence_bits"]:
        got = evidence_bit(case["id"], case["bits"])
        if got != case["bit"]:
            bad.append("evidence bit %r/%d: %d" % (case["id"], case["bits"], got))
    for case in v["masters"]:
        try:
            version, bitmap = decode_master(case["value"].encode(), case["bits"])
            got = (str(version), [b for b in range(case["bits"]) if has_bit(bitmap, b)])
        except ValueError:
            got = None
        if (got is not None) != case["valid"] or (got is not None and got != (case["version"], case["set"])):
            bad.append("master %r: %r" % (case["value"], got))
    for case in v.get("position_keys", []):
        if position_key(case["server_id"]) != case["key"].encode():
            bad.append("position key %d: %r" % (case["server_id"], position_key(case["server_id"])))
    sp = v.get("source_positions", {})
    for case in sp.get("items", []):
        try:
            pos = decode_position(case["value"].encode())
        except ValueError:
            if not case.get("error"):
                bad.append("position %s: does not decode" % case["name"])
            continue
        if case.get("error"):
            bad.append("position %s: decodes, want an error" % case["name"])
            continue
        if encode_position(pos) != case["position"].encode():
            bad.append("position %s: %r" % (case["name"], encode_position(pos)))
        w = replica_wait(pos, sp["max_wait"])
        want = case["wait"]
        got = None if w is None else {"function": w[0], "query": w[1], "args": w[2]}
        if got != want:
            bad.append("position %s wait: %r != %r" % (case["name"], got, want))
    for case in sp.get("outcomes", []):
        got = wait_outcome(case["function"], case["result"])
        if got != case["outcome"]:
            bad.append("wait outcome %s %r: %s" % (case["function"], case["result"], got))
    for case in v.get("lifetimes", []):
        if "mg" in case:
            got = (lease_get(b"KEY", case["compute_time"]).decode(), stored_ttl(case["lifetime"], case["compute_time"]))
            want = (case["mg"], case["ms_ttl"])
        elif "md" in case:
            got, want = invalidate(b"KEY", case["stale_for"]).decode(), case["md"]
        else:
            got, want = _at_least(case["rule_ttl"]), case["reader_ttl"]
        if got != want:
            bad.append("lifetimes %s: %r != %r" % (case["name"], got, want))
    return bad


def serve(server):
    """Answers JSON requests, one per line of stdin, on one line each."""
    from pymemcache.client.base import Client

    host, port = server.rsplit(":", 1)
    mc = Client((host, int(port)), connect_timeout=2, timeout=2)
    meta = MetaConn(host, int(port))
    for line in sys.stdin:
        req = json.loads(line)
        k = key(req["prefix"], req["template"], req.get("row", {}))
        out = {"key": k.decode("utf-8", "surrogateescape")}
        op = req["op"]
        if op == "namespace" and "evidence" in req:
            ev = req["evidence"]
            out["version"] = evidence_namespaces(mc, req["prefix"], req["template"], ev["column"],
                                                 ev["master"].encode(), ev["bits"], [req["row"]])[0]
        elif op == "namespace" and "copies" in req:
            out["version"] = str(hot_namespace(mc, req["prefix"], req["template"], req["row"], req["copies"]))
        elif op == "namespace":
            out["version"] = str(namespace(mc, k))
        elif op == "members":
            gk = generation_key(req["prefix"], req.get("database", ""), req["table"])
            ms = members(mc, k, gk)
            out["members"] = None if ms is None else [m.decode("utf-8") for m in ms]
        elif op == "count":
            gk = generation_key(req["prefix"], req.get("database", ""), req["table"])
            n = count(mc, k, gk)
            out["count"] = None if n is None else str(n)
        elif op == "get_or_compute":
            computed = []

            def compute():
                computed.append(True)
                if req.get("delete_during_compute"):
                    # What another tool's invalidation does meanwhile.
                    mc.delete(k, noreply=False)
                return req["compute"].encode()

            out["value"] = get_or_compute(meta, k, req["lifetime"], compute).decode()
            out["computed"] = bool(computed)
        elif op == "replica_wait":
            value = mc.get(position_key(req["server_id"]))
            try:
                w = None if value is None else replica_wait(decode_position(value), req["max_wait"])
            except ValueError:
                w = None
            out["wait"] = None if w is None else {"function": w[0], "query": w[1], "args": w[2]}
        elif op == "wait_for_position":
            import pymysql

            my = req["mysql"]
            db = pymysql.connect(host=my["host"], port=my["port"], user=my["user"], database=my["database"])
            try:
                out["outcome"] = wait_for_position(mc, req["server_id"], db.cursor(), req["max_wait"])
            finally:
                db.close()
        print(json.dumps(out), flush=True)


USAGE_HINT = ("give --vectors FILE to check this reader against the shared test vectors, "
              "or --server HOST:PORT to answer JSON requests from stdin; --help says more")


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Used as a module, import it and call key(), namespace(), members(), count(), get_or_compute().")
    p.add_argument("--vectors", metavar="FILE",
                   help="check this reader against the test vectors in FILE "
                        "(testdata/formats/vectors.json); exits 1 and lists the failures on stderr if any")
    p.add_argument("--server", metavar="HOST:PORT",
                   help="answer JSON requests, one per line of stdin, with the items of the memcached at "
                        "HOST:PORT, one JSON answer per line on stdout (how client/readers_test.go drives it)")
    args = p.parse_args(argv)
    if not args.vectors and not args.server:
        p.print_usage(sys.stderr)
        print("%s: nothing to do: %s" % (p.prog, USAGE_HINT), file=sys.stderr)
        sys.exit(2)
    if args.vectors:
        bad = check_vectors(args.vectors)
        for b in bad:
            print(b, file=sys.stderr)
        sys.exit(1 if bad else 0)
    serve(args.server)


if __name__ == "__main__":
    main()
