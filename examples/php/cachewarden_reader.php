<?php
// Reads what cachewarden keeps in memcached, following docs/formats.md.
//
// A small reader for PHP applications on php-memcached (Debian's
// php-memcached): keys built like the daemon's, namespace versions (hot-key
// copies and master namespaces with evidence included), sets and counters
// (each read with its table's generation: cw_members($mc, $key,
// cw_generation_key($prefix, $db, $table))). (php-memcached has no meta commands, so it reads the
// values GetOrCompute stores with a plain get and leaves recomputation to
// meta-protocol clients.) Fills from a replica wait for the daemon's source
// position first: cw_wait_for_position($mc, $server_id, $pdo).
//
//   $mc = new Memcached(); $mc->addServer('127.0.0.1', 11211);
//   $version = cw_namespace($mc, cw_key('shop:', 'ns:user:{id}', ['id' => 42]));
//
// As a program it checks itself against the shared test vectors
// (--vectors FILE), or answers JSON requests read line by line from stdin
// (--server HOST:PORT), which is how client/readers_test.go compares it
// with the Go client.

const CW_MAX_KEY = 250;
const CW_HASHED_HEAD = 200;
// The daemon's marks: '%' followed by anything but two upper-case hex
// digits, which no rendered key holds (docs/formats.md, Keys).
const CW_HASH_MARK = '%#';
const CW_COPY_MARK = '%copy';

// cw_text returns the text of a row value: integers as decimal digits,
// booleans as 1/0, strings as their bytes.
function cw_text($value): string {
    if (is_bool($value)) {
        return $value ? '1' : '0';
    }
    if (is_int($value) || is_string($value)) {
        return (string)$value;
    }
    if ($value === null) {
        throw new InvalidArgumentException('NULL makes no key');
    }
    throw new InvalidArgumentException('unsupported value type ' . gettype($value));
}

// cw_escape escapes bytes as keys and members are: <= 0x20, 0x7f and %
// become %XX.
function cw_escape(string $raw): string {
    $out = '';
    $n = strlen($raw);
    for ($i = 0; $i < $n; $i++) {
        $b = ord($raw[$i]);
        $out .= ($b <= 0x20 || $b === 0x7f || $b === 0x25) ? sprintf('%%%02X', $b) : $raw[$i];
    }
    return $out;
}

// cw_unescape reverses cw_escape: %XX (either case) becomes that byte.
function cw_unescape(string $escaped): string {
    return preg_replace_callback('/%([0-9A-Fa-f]{2})/', fn($m) => chr(hexdec($m[1])), $escaped);
}

// cw_finish_key applies the 250-byte rule to a complete key.
function cw_finish_key(string $key): string {
    if (strlen($key) <= CW_MAX_KEY) {
        return $key;
    }
    return substr($key, 0, CW_HASHED_HEAD) . CW_HASH_MARK . substr(hash('sha256', $key), 0, 32);
}

// cw_rendered returns prefix and template rendered for a row's values,
// before the 250-byte rule.
function cw_rendered(string $prefix, string $template, array $values): string {
    return $prefix . preg_replace_callback('/\{([^{}]+)\}/', function ($m) use ($values) {
        if (!array_key_exists($m[1], $values)) {
            throw new InvalidArgumentException("no value for column {$m[1]}");
        }
        return cw_escape(cw_text($values[$m[1]]));
    }, $template);
}

// cw_key returns the memcached key of a key template for a row's values.
function cw_key(string $prefix, string $template, array $values): string {
    return cw_finish_key(cw_rendered($prefix, $template, $values));
}

// cw_copy_key returns the key of copy $i of a namespace kept in copies.
function cw_copy_key(string $prefix, string $template, array $values, int $i): string {
    return cw_finish_key(cw_rendered($prefix, $template, $values) . CW_COPY_MARK . $i);
}

// cw_evidence_bit returns the bit of an entity id in an evidence bitmap.
function cw_evidence_bit($id, int $bits): int {
    $text = cw_text($id);
    $digits = (strlen($text) > 0 && $text[0] === '-') ? substr($text, 1) : $text;
    if ($digits !== '' && ctype_digit($digits)) {
        $r = 0;
        for ($i = 0; $i < strlen($digits); $i++) {
            $r = ($r * 10 + (ord($digits[$i]) - 48)) % $bits;
        }
        return $r;
    }
    return crc32($text) % $bits;
}

// cw_decode_master returns a master item as [version text, bitmap bytes],
// or null when it is not a master item of $bits bits.
function cw_decode_master(string $value, int $bits): ?array {
    $parts = explode(' ', rtrim($value, ' '));
    $version = count($parts) === 2 ? cw_decimal_at_most($parts[0], '18446744073709551615') : null;
    if ($version === null || strlen($parts[1]) !== intdiv($bits, 4) || !preg_match('/^[0-9a-f]*$/', $parts[1])) {
        return null;
    }
    return [$version, hex2bin($parts[1])];
}

function cw_has_bit(string $bitmap, int $b): bool {
    return (ord($bitmap[intdiv($b, 8)]) & (0x80 >> ($b % 8))) !== 0;
}

// cw_namespace_start returns the version (decimal text) a namespace
// created at $unix_ms starts at: $unix_ms times 2^20 (below 2^63 until
// the year 2248, so a PHP int holds it).
function cw_namespace_start(int $unix_ms): string {
    return (string)(max($unix_ms, 0) << 20);
}

// cw_at_least returns the exptime of an item that must live at least $ttl
// seconds: memcached's clock ticks in whole seconds and ends an item of n
// seconds after n-1 to n of them, so one more (0: no expiry). Beyond 30
// days memcached takes an exptime as a Unix time.
function cw_at_least(int $ttl): int {
    if ($ttl <= 0) {
        return 0;
    }
    $n = $ttl + 1;
    return $n > 30 * 24 * 3600 ? $n + time() : $n;
}

// cw_decimal_at_most returns ASCII decimal $text without leading zeros when
// it is at most $max (decimal text, no leading zeros), else null. Versions
// go up to 2^64-1, beyond a PHP int, so they are compared as text.
function cw_decimal_at_most(string $text, string $max): ?string {
    if ($text === '' || !ctype_digit($text)) {
        return null;
    }
    $text = ltrim($text, '0') ?: '0';
    if (strlen($text) > strlen($max) || (strlen($text) === strlen($max) && strcmp($text, $max) > 0)) {
        return null;
    }
    return $text;
}

// cw_parse_version returns a namespace version (unsigned 64-bit; ASCII
// spaces, tabs, CR and LF around it ignored) as decimal text, or null.
function cw_parse_version(string $value): ?string {
    return cw_decimal_at_most(trim($value, " \t\r\n"), '18446744073709551615');
}

// cw_parse_count returns a counter (trailing spaces ignored, at most
// 2^63-1) as decimal text, or null.
function cw_parse_count(string $value): ?string {
    return cw_decimal_at_most(rtrim($value, ' '), '9223372036854775807');
}

// cw_generation_key returns the key of a table's generation item: prefix,
// "gen:", the escaped database and "." when there is one, the escaped
// table.
function cw_generation_key(string $prefix, string $database, string $table): string {
    $db = $database === '' ? '' : cw_escape($database) . '.';
    return cw_finish_key($prefix . '%gen:' . $db . cw_escape($table));
}

// cw_counter_key returns the key of the counter at $key under a generation
// (decimal text).
function cw_counter_key(string $key, string $generation): string {
    return cw_finish_key($key . '%@' . $generation);
}

// cw_decode_set returns the members of a set item, escaped as its tokens
// spell them, in order, its token and garbage counts, and the generation
// of its leading generation token (decimal text; null when it has none).
function cw_decode_set(string $value): array {
    $order = [];
    $present = [];
    $tokens = 0;
    $generation = null;
    foreach (preg_split('/[\x00-\x20\x7f]+/', $value, -1, PREG_SPLIT_NO_EMPTY) as $i => $tok) {
        if ($i === 0 && $tok[0] === 'g' && strlen($tok) > 1) {
            $generation = cw_decimal_at_most(substr($tok, 1), '18446744073709551615');
            if ($generation !== null) {
                continue;
            }
        }
        $tokens++;
        $op = $tok[0];
        $member = (string)substr($tok, 1);
        if ($op === '+') {
            if (!isset($present[$member]) || $present[$member] < 0) {
                $present[$member] = count($order);
                $order[] = $member;
            }
        } elseif ($op === '-') {
            if (isset($present[$member])) {
                $present[$member] = -1;
            }
        }
    }
    $members = [];
    foreach ($order as $i => $m) {
        if ($present[$m] === $i) {
            $members[] = $m;
        }
    }
    return [$members, $tokens, $tokens - count($members), $generation];
}

// cw_encode_set returns the compact item holding exactly the escaped
// members, after the generation token when there is a generation.
function cw_encode_set(array $escaped, ?string $generation = null): string {
    $out = $generation === null ? '' : 'g' . $generation . ' ';
    foreach ($escaped as $m) {
        $out .= '+' . $m . ' ';
    }
    return $out;
}

// cw_namespace returns the version at $key, created with the namespace
// start when missing.
function cw_namespace(Memcached $mc, string $key, int $ttl = 0): string {
    for ($attempt = 0; $attempt < 3; $attempt++) {
        $value = $mc->get($key);
        if ($value !== false) {
            $v = cw_parse_version((string)$value);
            if ($v === null) {
                throw new UnexpectedValueException("namespace $key holds " . json_encode($value));
            }
            return $v;
        }
        $start = cw_namespace_start((int)floor(microtime(true) * 1000));
        if ($mc->add($key, $start, cw_at_least($ttl))) {
            return $start;
        }
    }
    throw new RuntimeException("namespace $key evicted 3 times in a row");
}

// cw_hot_namespace returns the version of a namespace kept in copies, read
// from one at random.
function cw_hot_namespace(Memcached $mc, string $prefix, string $template, array $values, int $copies): string {
    return cw_namespace($mc, cw_copy_key($prefix, $template, $values, random_int(0, $copies - 1)));
}

// cw_evidence_namespaces returns the versions of the namespaces of $rows
// under a master with evidence: "m" and the master version for entities
// whose bit is clear, their own namespace's version otherwise.
function cw_evidence_namespaces(Memcached $mc, string $prefix, string $template, string $column,
                                string $master, int $bits, array $rows, int $ttl = 0): array {
    $m = null;
    for ($attempt = 0; $attempt < 3 && $m === null; $attempt++) {
        $got = $mc->get($master, null, Memcached::GET_EXTENDED);
        $m = $got === false ? null : cw_decode_master((string)$got['value'], $bits);
        if ($m !== null) {
            break;
        }
        $fresh = cw_namespace_start((int)floor(microtime(true) * 1000)) . ' ' . str_repeat('0', intdiv($bits, 4));
        $stored = $got === false ? $mc->add($master, $fresh, cw_at_least($ttl)) : $mc->cas($got['cas'], $master, $fresh, cw_at_least($ttl));
        if ($stored) {
            $m = cw_decode_master($fresh, $bits);
        }
    }
    if ($m === null) {
        throw new RuntimeException("master $master changed or evicted 3 times in a row");
    }
    $out = [];
    foreach ($rows as $row) {
        $out[] = cw_has_bit($m[1], cw_evidence_bit($row[$column], $bits))
            ? cw_namespace($mc, cw_key($prefix, $template, $row), $ttl)
            : 'm' . $m[0];
    }
    return $out;
}

// cw_generation returns the generation in the generation item $value
// (false when missing), or null.
function cw_generation($value): ?string {
    return $value === false || $value === null ? null : cw_parse_version((string)$value);
}

// cw_members returns the members of the set at $key, or null when it is
// missing or not of the current generation of its table (generation item
// $gen_key), read together in one round trip.
function cw_members(Memcached $mc, string $key, string $gen_key): ?array {
    $items = $mc->getMulti([$key, $gen_key]);
    $items = $items === false ? [] : $items;
    $generation = cw_generation($items[$gen_key] ?? false);
    if ($generation === null || !isset($items[$key])) {
        return null;
    }
    [$escaped, , , $stamped] = cw_decode_set((string)$items[$key]);
    if ($stamped !== $generation) {
        return null;
    }
    return array_map('cw_unescape', $escaped);
}

// cw_count returns the counter at $key under the current generation of
// its table (generation item $gen_key), as decimal text, or null. The
// generation last read is guessed so that, while it stays, one round
// trip reads both.
function cw_count(Memcached $mc, string $key, string $gen_key): ?string {
    static $last = [];
    $keys = [$gen_key];
    $guess = $last[$gen_key] ?? null;
    if ($guess !== null) {
        $keys[] = cw_counter_key($key, $guess);
    }
    $items = $mc->getMulti($keys);
    $items = $items === false ? [] : $items;
    $generation = cw_generation($items[$gen_key] ?? false);
    if ($generation === null) {
        return null;
    }
    $last[$gen_key] = $generation;
    $counter = cw_counter_key($key, $generation);
    $value = $generation === $guess ? ($items[$counter] ?? false) : $mc->get($counter);
    return $value === false ? null : cw_parse_count((string)$value);
}

const CW_POSITION_MARK = '%pos:';
const CW_MAX_POSITION_GTIDS = 64;

// cw_position_key returns the key of the position item of the source
// server $server_id (docs/formats.md, "Source positions").
function cw_position_key(int $server_id): string {
    return CW_POSITION_MARK . $server_id;
}

// cw_parse_gtid parses one GTID: MariaDB's ['d', 's', 'n'] or MySQL's
// ['uuid', 'n'] (numbers as decimal text: a sequence number may exceed
// PHP's integers); null for anything else.
function cw_parse_gtid(string $s): ?array {
    if (strpos($s, ':') !== false) {
        [$uuid, $n] = explode(':', $s, 2);
        $uuid = strtolower($uuid);
        $n = cw_decimal_at_most($n, '18446744073709551615');
        if (!preg_match('/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/D', $uuid) || $n === null || $n === '0') {
            return null;
        }
        return [$uuid, $n];
    }
    $parts = explode('-', $s);
    if (count($parts) !== 3) {
        return null;
    }
    $g = [cw_decimal_at_most($parts[0], '4294967295'), cw_decimal_at_most($parts[1], '4294967295'),
        cw_decimal_at_most($parts[2], '18446744073709551615')];
    return in_array(null, $g, true) ? null : $g;
}

// cw_decode_position reads a position item: ['gtids' => [...] sorted,
// 'binlog' => [file, offset] or null]; null when a gtid= or binlog= token
// does not parse.
function cw_decode_position(string $value): ?array {
    $gtids = [];
    $binlog = null;
    foreach (preg_split('/[ \t\r\n]+/', $value, -1, PREG_SPLIT_NO_EMPTY) as $tok) {
        if (strncmp($tok, 'gtid=', 5) === 0) {
            $entries = explode(',', substr($tok, 5));
            if (count($entries) > CW_MAX_POSITION_GTIDS) {
                return null;
            }
            foreach ($entries as $e) {
                $g = cw_parse_gtid($e);
                if ($g === null) {
                    return null;
                }
                foreach ($gtids as $h) {
                    if (count($h) === count($g) && $h[0] === $g[0]) {
                        return null; // two GTIDs of one stream
                    }
                }
                $gtids[] = $g;
            }
        } elseif (strncmp($tok, 'binlog=', 7) === 0) {
            $fp = substr($tok, 7);
            $i = strrpos($fp, ':');
            if ($i === false || $i === 0 || !preg_match('/^[0-9]+$/D', substr($fp, $i + 1))) {
                return null;
            }
            $binlog = [substr($fp, 0, $i), (int)substr($fp, $i + 1)];
        }
    }
    usort($gtids, function ($a, $b) {
        if (count($a) !== count($b)) {
            return count($a) === 3 ? -1 : 1; // MariaDB first
        }
        return count($a) === 3 ? (int)$a[0] <=> (int)$b[0] : strcmp($a[0], $b[0]);
    });
    return ['gtids' => $gtids, 'binlog' => $binlog];
}

function cw_gtid_text(array $g): string {
    return count($g) === 2 ? "{$g[0]}:{$g[1]}" : implode('-', $g);
}

// cw_encode_position writes a position item's value.
function cw_encode_position(array $pos): string {
    $parts = [];
    if ($pos['gtids']) {
        $parts[] = 'gtid=' . implode(',', array_map('cw_gtid_text', $pos['gtids']));
    }
    if ($pos['binlog'] !== null) {
        $parts[] = "binlog={$pos['binlog'][0]}:{$pos['binlog'][1]}";
    }
    return implode(' ', $parts);
}

// cw_replica_wait returns the statement that waits until a replica has
// applied $pos, at most $max_wait seconds: [function, query with ?
// placeholders, args], or null when $pos gives no wait.
function cw_replica_wait(array $pos, float $max_wait): ?array {
    $gtids = $pos['gtids'];
    if ($gtids) {
        $mysql = count($gtids[0]) === 2;
        foreach ($gtids as $g) {
            if ((count($g) === 2) !== $mysql) {
                return null;
            }
        }
        if ($mysql) {
            return ['WAIT_FOR_EXECUTED_GTID_SET', 'SELECT WAIT_FOR_EXECUTED_GTID_SET(?, ?)',
                [implode(',', array_map(fn($g) => "{$g[0]}:1-{$g[1]}", $gtids)), $max_wait]];
        }
        return ['MASTER_GTID_WAIT', 'SELECT MASTER_GTID_WAIT(?, ?)', [implode(',', array_map('cw_gtid_text', $gtids)), $max_wait]];
    }
    if ($pos['binlog'] !== null) {
        return ['MASTER_POS_WAIT', 'SELECT MASTER_POS_WAIT(?, ?, ?)', [$pos['binlog'][0], $pos['binlog'][1] + 1, $max_wait]];
    }
    return null;
}

// cw_wait_outcome reads the wait's single result (null for NULL):
// 'reached', 'timed_out' or 'unusable'.
function cw_wait_outcome(string $function, $result): string {
    if ($result === null || !preg_match('/^\s*-?[0-9]+\s*$/D', (string)$result)) {
        return 'unusable';
    }
    $n = (int)$result;
    switch ($function) {
        case 'MASTER_GTID_WAIT':
            return $n === 0 ? 'reached' : ($n === -1 ? 'timed_out' : 'unusable');
        case 'WAIT_FOR_EXECUTED_GTID_SET':
            return $n === 0 ? 'reached' : ($n === 1 ? 'timed_out' : 'unusable');
        case 'MASTER_POS_WAIT':
            return $n >= 0 ? 'reached' : ($n === -1 ? 'timed_out' : 'unusable');
    }
    return 'unusable';
}

// cw_wait_for_position, before a fill from a replica, reads the position
// item of the replica's source $server_id and waits on $pdo (the
// connection the fill then uses) until the replica has applied it.
// Returns 'reached', 'timed_out' (read the primary, or store the result
// briefly) or 'unfenced' (no usable position, or a replica that cannot
// wait for it: fill as before).
function cw_wait_for_position(Memcached $mc, int $server_id, PDO $pdo, float $max_wait = 1.0): string {
    $value = $mc->get(cw_position_key($server_id));
    if ($value === false || ($pos = cw_decode_position((string)$value)) === null
        || ($w = cw_replica_wait($pos, $max_wait)) === null) {
        return 'unfenced';
    }
    $st = $pdo->prepare($w[1]);
    $st->execute($w[2]);
    $result = $st->fetchColumn();
    $outcome = cw_wait_outcome($w[0], $result === false ? null : $result);
    return $outcome === 'unusable' ? 'unfenced' : $outcome;
}

// cw_check_vectors checks this reader against the shared test vectors and
// returns the failures.
function cw_check_vectors(string $path): array {
    $v = json_decode(file_get_contents($path), true, 512, JSON_BIGINT_AS_STRING | JSON_THROW_ON_ERROR);
    $bad = [];
    foreach ($v['keys'] as $c) {
        $got = cw_key($c['prefix'], $c['template'], $c['values']);
        if ($got !== $c['key']) {
            $bad[] = "key {$c['name']}: $got";
        }
    }
    foreach ($v['tokens'] as $c) {
        $got = ($c['add'] ? '+' : '-') . cw_escape($c['member']) . ' ';
        if ($got !== $c['token']) {
            $bad[] = "token {$c['member']}: $got";
        }
    }
    foreach ($v['sets'] as $c) {
        [$escaped, $tokens, $garbage, $generation] = cw_decode_set($c['value']);
        $got = array_map('cw_unescape', $escaped);
        if ($got !== $c['members'] || $tokens !== $c['tokens'] || $garbage !== $c['garbage']
            || $generation !== ($c['generation'] ?? null)) {
            $bad[] = "set {$c['name']}: " . json_encode($got) . " $tokens $garbage " . json_encode($generation);
        }
        if (cw_encode_set($escaped, $generation) !== $c['compacted']) {
            $bad[] = "set {$c['name']} compacted: " . cw_encode_set($escaped, $generation);
        }
    }
    foreach ($v['generations'] ?? [] as $c) {
        $got = cw_generation_key($c['prefix'], $c['database'], $c['table']);
        if ($got !== $c['key']) {
            $bad[] = "generation key {$c['key']}: $got";
        }
    }
    foreach ($v['counter_keys'] ?? [] as $c) {
        $got = cw_counter_key($c['key'], $c['generation']);
        if ($got !== $c['counter_key']) {
            $bad[] = "counter key {$c['counter_key']}: $got";
        }
    }
    foreach ($v['namespaces'] as $c) {
        $got = cw_parse_version($c['value']);
        if (($got !== null) !== $c['valid'] || ($got !== null && $got !== $c['version'])) {
            $bad[] = "namespace " . json_encode($c['value']) . ": " . json_encode($got);
        }
    }
    foreach ($v['namespace_start'] as $c) {
        if (cw_namespace_start((int)$c['unix_ms']) !== $c['start']) {
            $bad[] = "namespace start {$c['unix_ms']}";
        }
    }
    foreach ($v['counters'] as $c) {
        $got = cw_parse_count($c['value']);
        if (($got !== null) !== $c['valid'] || ($got !== null && $got !== $c['count'])) {
            $bad[] = "counter " . json_encode($c['value']) . ": " . json_encode($got);
        }
    }
    foreach ($v['copy_keys'] as $c) {
        $got = cw_copy_key($c['prefix'], $c['template'], $c['values'] ?? [], $c['copy']);
        if ($got !== $c['key']) {
            $bad[] = "copy key {$c['key']}: $got";
        }
    }
    foreach ($v['evidence_bits'] as $c) {
        $got = cw_evidence_bit($c['id'], $c['bits']);
        if ($got !== $c['bit']) {
            $bad[] = "evidence bit {$c['id']}/{$c['bits']}: $got";
        }
    }
    foreach ($v['masters'] as $c) {
        $m = cw_decode_master($c['value'], $c['bits']);
        $got = null;
        if ($m !== null) {
            $set = [];
            for ($b = 0; $b < $c['bits']; $b++) {
                if (cw_has_bit($m[1], $b)) {
                    $set[] = $b;
                }
            }
            $got = [$m[0], $set];
        }
        if (($got !== null) !== $c['valid'] || ($got !== null && $got !== [$c['version'], $c['set']])) {
            $bad[] = "master " . json_encode($c['value']) . ": " . json_encode($got);
        }
    }
    foreach ($v['position_keys'] ?? [] as $c) {
        if (cw_position_key((int)$c['server_id']) !== $c['key']) {
            $bad[] = "position key {$c['server_id']}: " . cw_position_key((int)$c['server_id']);
        }
    }
    $sp = $v['source_positions'] ?? [];
    foreach ($sp['items'] ?? [] as $c) {
        $pos = cw_decode_position($c['value']);
        if ($pos === null || !empty($c['error'])) {
            if (($pos === null) !== !empty($c['error'])) {
                $bad[] = "position {$c['name']}: " . json_encode($pos);
            }
            continue;
        }
        if (cw_encode_position($pos) !== $c['position']) {
            $bad[] = "position {$c['name']}: " . cw_encode_position($pos);
        }
        $w = cw_replica_wait($pos, (float)$sp['max_wait']);
        $got = $w === null ? null : ['function' => $w[0], 'query' => $w[1], 'args' => $w[2]];
        $want = $c['wait'];
        if ($want !== null) {
            $want['args'] = array_map(fn($a) => is_string($a) ? $a : $a + 0, $want['args']);
        }
        if ($got != $want || ($got !== null && json_encode($got['args']) !== json_encode($want['args']))) {
            $bad[] = "position {$c['name']} wait: " . json_encode($got) . ' != ' . json_encode($want);
        }
    }
    foreach ($sp['outcomes'] ?? [] as $c) {
        $got = cw_wait_outcome($c['function'], $c['result']);
        if ($got !== $c['outcome']) {
            $bad[] = "wait outcome {$c['function']} " . json_encode($c['result']) . ": $got";
        }
    }
    foreach ($v['lifetimes'] ?? [] as $c) {
        // php-memcached has no meta commands: only the lifetimes of the
        // items this reader creates apply.
        if (isset($c['rule_ttl']) && cw_at_least((int)$c['rule_ttl']) !== $c['reader_ttl']) {
            $bad[] = "lifetimes {$c['name']}: " . cw_at_least((int)$c['rule_ttl']);
        }
    }
    return $bad;
}

// cw_serve answers JSON requests, one per line of stdin, on one line each.
function cw_serve(string $server): void {
    [$host, $port] = explode(':', $server, 2);
    $mc = new Memcached();
    $mc->addServer($host, (int)$port);
    while (($line = fgets(STDIN)) !== false) {
        $req = json_decode($line, true, 512, JSON_THROW_ON_ERROR);
        $key = cw_key($req['prefix'], $req['template'], $req['row'] ?? []);
        $out = ['key' => $key];
        switch ($req['op']) {
            case 'namespace':
                if (isset($req['evidence'])) {
                    $ev = $req['evidence'];
                    $out['version'] = cw_evidence_namespaces($mc, $req['prefix'], $req['template'], $ev['column'],
                        $ev['master'], $ev['bits'], [$req['row']])[0];
                } elseif (isset($req['copies'])) {
                    $out['version'] = cw_hot_namespace($mc, $req['prefix'], $req['template'], $req['row'], $req['copies']);
                } else {
                    $out['version'] = cw_namespace($mc, $key);
                }
                break;
            case 'members':
                $out['members'] = cw_members($mc, $key, cw_generation_key($req['prefix'], $req['database'] ?? '', $req['table']));
                break;
            case 'count':
                $out['count'] = cw_count($mc, $key, cw_generation_key($req['prefix'], $req['database'] ?? '', $req['table']));
                break;
            case 'replica_wait':
                $value = $mc->get(cw_position_key((int)$req['server_id']));
                $pos = $value === false ? null : cw_decode_position((string)$value);
                $w = $pos === null ? null : cw_replica_wait($pos, (float)$req['max_wait']);
                $out['wait'] = $w === null ? null : ['function' => $w[0], 'query' => $w[1], 'args' => $w[2]];
                break;
            case 'wait_for_position':
                $my = $req['mysql'];
                $pdo = new PDO("mysql:host={$my['host']};port={$my['port']};dbname={$my['database']}", $my['user'], '',
                    [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
                $out['outcome'] = cw_wait_for_position($mc, (int)$req['server_id'], $pdo, (float)$req['max_wait']);
                break;
            case 'get':
                $value = $mc->get($key);
                $out['value'] = $value === false ? null : (string)$value;
                break;
        }
        echo json_encode($out, JSON_UNESCAPED_SLASHES), "\n";
        fflush(STDOUT);
    }
}

const CW_USAGE = <<<'EOT'
usage: php cachewarden_reader.php [--help] [--vectors FILE] [--server HOST:PORT]

Reads what cachewarden keeps in memcached, following docs/formats.md.

options:
  --help              show this help and exit
  --vectors FILE      check this reader against the test vectors in FILE
                      (testdata/formats/vectors.json); exits 1 and lists
                      the failures on stderr if any
  --server HOST:PORT  answer JSON requests, one per line of stdin, with the
                      items of the memcached at HOST:PORT, one JSON answer
                      per line on stdout (how client/readers_test.go drives it)

Used as a library, include it and call cw_key(), cw_namespace(),
cw_members(), cw_count(), cw_wait_for_position().

EOT;

if (PHP_SAPI === 'cli' && realpath($argv[0]) === __FILE__) {
    $opts = getopt('h', ['help', 'vectors:', 'server:'], $rest);
    if (isset($opts['help']) || isset($opts['h'])) {
        echo CW_USAGE;
        exit(0);
    }
    foreach (['vectors' => 'FILE', 'server' => 'HOST:PORT'] as $flag => $what) {
        if (!isset($opts[$flag]) && in_array('--' . $flag, $argv, true)) {
            fwrite(STDERR, "cachewarden_reader.php: --$flag needs a value: --$flag $what\n" . CW_USAGE);
            exit(2);
        }
    }
    if ($rest < count($argv)) {
        fwrite(STDERR, "cachewarden_reader.php: unexpected argument " . $argv[$rest] . "\n" . CW_USAGE);
        exit(2);
    }
    if (isset($opts['vectors'])) {
        $bad = cw_check_vectors($opts['vectors']);
        foreach ($bad as $b) {
            fwrite(STDERR, $b . "\n");
        }
        exit($bad ? 1 : 0);
    }
    if (isset($opts['server'])) {
        cw_serve($opts['server']);
        exit(0);
    }
    fwrite(STDERR, "cachewarden_reader.php: nothing to do: give --vectors FILE to check this reader against the "
        . "shared test vectors, or --server HOST:PORT to answer JSON requests from stdin; --help says more\n");
    exit(2);
}
