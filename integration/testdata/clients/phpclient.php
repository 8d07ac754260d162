<?php
// Writes or checks memcached items through php-memcached.
//
// Usage: php phpclient.php CLIENT MODE SERVERS < keys.json
//
// CLIENT is one of:
//   php-memcached              defaults (modula, one-at-a-time)
//   php-memcached-ketama       Memcached::OPT_LIBKETAMA_COMPATIBLE
//   php-memcached-consistent   Memcached::OPT_DISTRIBUTION = DISTRIBUTION_CONSISTENT
// MODE is "seed", "check" or "locate" (see pyclient.py). SERVERS is a
// comma-separated list of host:port, each optionally followed by
// "/weight". Keys arrive on stdin as a JSON list; the result is JSON.

[$self, $name, $mode, $serverList] = $argv;
$keys = json_decode(stream_get_contents(STDIN), true);
$m = new Memcached();
$m->setOption(Memcached::OPT_COMPRESSION, false);
switch ($name) {
case 'php-memcached':
    break;
case 'php-memcached-ketama':
    $m->setOption(Memcached::OPT_LIBKETAMA_COMPATIBLE, true);
    break;
case 'php-memcached-consistent':
    $m->setOption(Memcached::OPT_DISTRIBUTION, Memcached::DISTRIBUTION_CONSISTENT);
    break;
default:
    fwrite(STDERR, "unknown client $name\n");
    exit(2);
}
$servers = [];
foreach (explode(',', $serverList) as $spec) {
    $weight = 0;
    if (strpos($spec, '/') !== false) {
        [$spec, $weight] = explode('/', $spec);
    }
    $i = strrpos($spec, ':');
    $servers[] = [substr($spec, 0, $i), (int) substr($spec, $i + 1), (int) $weight];
}
$m->addServers($servers);

function raw_get(array $server, string $key): bool {
    $s = fsockopen($server[0], $server[1], $errno, $errstr, 5);
    fwrite($s, "get $key\r\n");
    $buf = '';
    while (substr($buf, -5) !== "END\r\n" && !feof($s)) {
        $buf .= fread($s, 65536);
    }
    fclose($s);
    return strncmp($buf, 'VALUE ', 6) === 0;
}

$out = [];
// Counters live under their table's generation (docs/formats.md,
// "Generations"): the generation item and the counter at its key.
const GENERATION = '1782579200000000000';
if ($mode === 'seed') {
    $m->set('%gen:shop.items', GENERATION);
    foreach ($keys as $k) {
        $m->set("ns:$k", '1000');
        $m->set("set:$k", '+a ');
        $m->set("cnt:$k%@" . GENERATION, '5');
    }
    $out = count($keys);
} elseif ($mode === 'check') {
    foreach ($keys as $k) {
        $vals = [];
        foreach (["ns:$k", "set:$k", "cnt:$k%@" . GENERATION] as $item) {
            $v = $m->get($item);
            $vals[] = $v === false ? null : (string) $v;
        }
        $out[] = $vals;
    }
} elseif ($mode === 'locate') {
    foreach ($keys as $k) {
        $m->set("loc:$k", '1');
        $where = [];
        foreach ($servers as $i => $srv) {
            if (raw_get($srv, "loc:$k")) {
                $where[] = $i;
            }
        }
        $m->delete("loc:$k");
        $out[] = count($where) === 1 ? $where[0] : -1;
    }
}
echo json_encode($out);
