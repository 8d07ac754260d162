<?php
// Reads what cachewarden keeps in memcached, following docs/formats.md.
//
// A small reader for PHP applications on php-memcached (Debian's
// php-memcached): keys built like the daemon's, namespace versions, sets
// and counters. (php-memcached has no meta commands, so it reads the
// values GetOrCompute stores with a plain get and leaves recomputation to
// meta-protocol clients.)
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
    return substr($key, 0, CW_HASHED_HEAD) . '#' . substr(hash('sha256', $key), 0, 32);
}

// cw_key returns the memcached key of a key template for a row's values.
function cw_key(string $prefix, string $template, array $values, string $suffix = ''): string {
    $rendered = preg_replace_callback('/\{([^{}]+)\}/', function ($m) use ($values) {
        if (!array_key_exists($m[1], $values)) {
            throw new InvalidArgumentException("no value for column {$m[1]}");
        }
        return cw_escape(cw_text($values[$m[1]]));
    }, $template);
    return cw_finish_key($prefix . $rendered . $suffix);
}

// cw_namespace_start returns the version (decimal text) a namespace
// created at $unix_ms starts at: $unix_ms times 2^20 (below 2^63 until
// the year 2248, so a PHP int holds it).
function cw_namespace_start(int $unix_ms): string {
    return (string)(max($unix_ms, 0) << 20);
}

// cw_parse_version returns a namespace version as decimal text, or null.
function cw_parse_version(string $value): ?string {
    $text = trim($value, " \t\r\n");
    return ($text !== '' && ctype_digit($text)) ? ltrim($text, '0') ?: '0' : null;
}

// cw_parse_count returns a counter as decimal text, or null.
function cw_parse_count(string $value): ?string {
    $text = rtrim($value, ' ');
    return ($text !== '' && ctype_digit($text)) ? ltrim($text, '0') ?: '0' : null;
}

// cw_decode_set returns the members of a set item, escaped as its tokens
// spell them, in order, and its token and garbage counts.
function cw_decode_set(string $value): array {
    $order = [];
    $present = [];
    $tokens = 0;
    foreach (preg_split('/[\x00-\x20\x7f]+/', $value, -1, PREG_SPLIT_NO_EMPTY) as $tok) {
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
    return [$members, $tokens, $tokens - count($members)];
}

// cw_encode_set returns the compact item holding exactly the escaped
// members.
function cw_encode_set(array $escaped): string {
    $out = '';
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
        if ($mc->add($key, $start, $ttl)) {
            return $start;
        }
    }
    throw new RuntimeException("namespace $key evicted 3 times in a row");
}

// cw_members returns the members of the set at $key, or null when it is
// missing.
function cw_members(Memcached $mc, string $key): ?array {
    $value = $mc->get($key);
    if ($value === false) {
        return null;
    }
    return array_map('cw_unescape', cw_decode_set((string)$value)[0]);
}

// cw_count returns the counter at $key (decimal text), or null.
function cw_count(Memcached $mc, string $key): ?string {
    $value = $mc->get($key);
    return $value === false ? null : cw_parse_count((string)$value);
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
        [$escaped, $tokens, $garbage] = cw_decode_set($c['value']);
        $got = array_map('cw_unescape', $escaped);
        if ($got !== $c['members'] || $tokens !== $c['tokens'] || $garbage !== $c['garbage']) {
            $bad[] = "set {$c['name']}: " . json_encode($got) . " $tokens $garbage";
        }
        if (cw_encode_set($escaped) !== $c['compacted']) {
            $bad[] = "set {$c['name']} compacted: " . cw_encode_set($escaped);
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
                $out['version'] = cw_namespace($mc, $key);
                break;
            case 'members':
                $out['members'] = cw_members($mc, $key);
                break;
            case 'count':
                $out['count'] = cw_count($mc, $key);
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

if (PHP_SAPI === 'cli' && realpath($argv[0]) === __FILE__) {
    $opts = getopt('', ['vectors:', 'server:']);
    if (isset($opts['vectors'])) {
        $bad = cw_check_vectors($opts['vectors']);
        foreach ($bad as $b) {
            fwrite(STDERR, $b . "\n");
        }
        exit($bad ? 1 : 0);
    }
    if (isset($opts['server'])) {
        cw_serve($opts['server']);
    }
}
