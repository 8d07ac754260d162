<?php
// Reads counters with php-memcached as applications configure it by
// default (text protocol, OPT_BINARY_PROTOCOL off); used by
// client/readers_test.go.
//
// usage: php read_counters.php HOST:PORT KEY...
//
// Prints one JSON object: for each client, for each key, [type, text] of
// the value php-memcached returned (null when missing).
[$host, $port] = explode(':', $argv[1]);
$clients = [];
$m = new Memcached();
$m->addServer($host, (int)$port);
$clients['php-memcached'] = $m;
$m = new Memcached();
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, false);
$m->addServer($host, (int)$port);
$clients['php-memcached-text'] = $m;
$m = new Memcached();
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, true);
$m->addServer($host, (int)$port);
$clients['php-memcached-binary'] = $m;
$out = [];
foreach ($clients as $name => $mc) {
    foreach (array_slice($argv, 2) as $k) {
        $v = $mc->get($k);
        if ($v === false && $mc->getResultCode() === Memcached::RES_NOTFOUND) {
            $out[$name][$k] = null;
        } elseif ($v === false) {
            $out[$name][$k] = ['error', $mc->getResultMessage()];
        } else {
            $out[$name][$k] = [gettype($v), is_scalar($v) ? (string)$v : json_encode($v)];
        }
    }
}
echo json_encode($out), "\n";
