#!/usr/bin/env bash
# Starts the services cachewarden's demo, tests and benchmarks need, on
# loopback only, and says what it leaves running.
#
# Usage: scripts/services.sh [demo|demo-binlog|bench|start|stop|status|env]
#
#   demo   what `make demo` needs:
#            - memcached on 127.0.0.1:${CACHEWARDEN_MEMCACHED_PORT:-11311};
#            - a MariaDB/MySQL server: 127.0.0.1:3306 when it answers, else
#              the machine's mariadbd is started, else a private instance
#              is started on port 3307 (data in .services/mysql).
#   demo-binlog
#          demo's services, and a MariaDB with the binary log on (as
#          bench), which `make demo DEMO_FLAGS="--source binlog"` reads.
#   bench  demo's services, and a MariaDB with the binary log on (the
#          server above when its log_bin is ON, else the private instance
#          on port 3307 with --log-bin), for exact (fenced) counters, and
#          a private MariaDB replicating from it with GTIDs on port 3309
#          (server_id 3): the replica of the replica fence's tests and
#          benchmark (docs/formats.md, "Source positions").
#   start  what `make test` needs: bench's services, and
#            - a second private MariaDB with the binary log on, on port
#              3308 (same binary log base name, server_id 2): the failover
#              target of the fault suite's counter scenario;
#            - the memcached clients of other languages the distribution
#              tests read through (python3-pylibmc, python3-pymemcache,
#              php-cli, php-memcached), and the MySQL drivers their
#              replica waits run on (python3-pymysql, php-mysql);
#            - promtool (Debian's prometheus package), which the alert
#              rules' unit tests run.
#   stop   stops what this script started (memcached, the private MariaDBs
#          and the machine's MariaDB if this script started it); a server
#          that was already running is left alone.
#   status says what is running and whether this script started it.
#   env    prints .services/env.
#
# Debian packages are installed with apt-get only when something is
# missing (memcached, mariadb-server, the clients, prometheus for
# promtool): a start where everything is installed runs no apt-get. That
# needs root; without apt-get the script says what to install.
#
# demo, bench and start write the addresses to .services/env, which
# `make` and the tests read (CACHEWARDEN_TEST_MEMCACHED,
# CACHEWARDEN_TEST_MYSQL_DSN, and with bench/start
# CACHEWARDEN_TEST_MYSQL_BINLOG_DSN, CACHEWARDEN_TEST_MYSQL_BINLOG2_DSN,
# CACHEWARDEN_TEST_MYSQL_REPLICA_DSN: the replica; its source is the
# BINLOG server).
#
# CACHEWARDEN_PRIVATE_MYSQL_PORT, CACHEWARDEN_SECOND_MYSQL_PORT and
# CACHEWARDEN_REPLICA_MYSQL_PORT move the private MariaDBs to other ports
# (with CACHEWARDEN_SERVICES_DIR, a second set of services beside the
# first).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# CACHEWARDEN_SERVICES_DIR moves the state (env file, pid files, private
# data directories) elsewhere; the tests of this script use it.
state=${CACHEWARDEN_SERVICES_DIR:-$root/.services}
mkdir -p "$state"
mc_port=${CACHEWARDEN_MEMCACHED_PORT:-11311}
private_mysql_port=${CACHEWARDEN_PRIVATE_MYSQL_PORT:-3307}
second_mysql_port=${CACHEWARDEN_SECOND_MYSQL_PORT:-3308}
replica_mysql_port=${CACHEWARDEN_REPLICA_MYSQL_PORT:-3309}

log() { echo "services: $*" >&2; }

apt_install() {
  if ! command -v apt-get >/dev/null; then
    log "cannot install $*: no apt-get; install it by hand"
    return 1
  fi
  log "installing $* with apt-get"
  if [ ! -f "$state/.apt-updated" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 && touch "$state/.apt-updated"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 100); do
    port_open "$1" && return 0
    sleep 0.1
  done
  return 1
}

# memcached's own pid file (-P) is written after it has dropped root for
# nobody, who may not be able to reach this directory: the script finds
# the pid by memcached's command line instead and writes the file itself.
mc_pid_file="$state/memcached-$mc_port.pid"

# memcached_pid prints the pid of the memcached this script starts on
# $mc_port (by its command line), if it runs.
memcached_pid() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in
      "memcached -d "*" -l 127.0.0.1 -p $mc_port "*) echo "${p#/proc/}"; return 0 ;;
    esac
  done
  return 1
}

start_memcached() {
  if port_open "$mc_port"; then
    return 0
  fi
  command -v memcached >/dev/null || apt_install memcached
  local user=()
  [ "$(id -u)" = 0 ] && user=(-u nobody)
  memcached -d "${user[@]}" -l 127.0.0.1 -p "$mc_port" -U 0 -m 512 -c 4096 -t 2
  wait_port "$mc_port" || { log "memcached did not start on port $mc_port"; exit 1; }
  if memcached_pid >"$mc_pid_file.tmp"; then
    mv "$mc_pid_file.tmp" "$mc_pid_file"
  else
    rm -f "$mc_pid_file.tmp"
    log "cannot find memcached's pid; stop it by hand"
  fi
  log "memcached listening on 127.0.0.1:$mc_port"
}

mysql_ping() { # port
  if command -v mariadb-admin >/dev/null; then
    mariadb-admin --protocol=tcp -h127.0.0.1 -P"$1" -uroot --connect-timeout=2 ping >/dev/null 2>&1
  elif command -v mysqladmin >/dev/null; then
    mysqladmin --protocol=tcp -h127.0.0.1 -P"$1" -uroot --connect-timeout=2 ping >/dev/null 2>&1
  else
    port_open "$1"
  fi
}

wait_mysql() {
  for _ in $(seq 1 150); do
    mysql_ping "$1" && return 0
    sleep 0.2
  done
  return 1
}

start_mysql() {
  if mysql_ping 3306; then
    mysql_port=3306
    return 0
  fi
  if mysql_ping "$private_mysql_port"; then
    mysql_port=$private_mysql_port
    return 0
  fi
  if [ -x /usr/sbin/mariadbd ] && [ -d /var/lib/mysql/mysql ]; then
    log "starting the machine's MariaDB"
    if command -v start-stop-daemon >/dev/null; then
      start-stop-daemon --start --oknodo --background --make-pidfile \
        --pidfile "$state/machine-mariadb.pid" --exec /usr/sbin/mariadbd || true
    fi
    if wait_mysql 3306; then
      mysql_port=3306
      return 0
    fi
  fi
  start_private_mysql
  mysql_port=$private_mysql_port
}

# start_private_mysql starts (initialising it first if needed) a private
# MariaDB on 127.0.0.1:$private_mysql_port with the binary log on, in ROW
# format.
start_private_mysql() {
  start_mariadb "$private_mysql_port" "$state/mysql" mysql 1
}

# start_second_mysql starts the second private MariaDB: port
# $second_mysql_port, the same binary log base name, server_id 2.
start_second_mysql() {
  start_mariadb "$second_mysql_port" "$state/mysql2" mysql2 2
  if mysql_binlog_on "$second_mysql_port"; then
    log "second MariaDB with the binary log on listening on 127.0.0.1:$second_mysql_port"
  else
    log "MariaDB on port $second_mysql_port has no binary log; the failover test will fail under CI"
  fi
}

# start_mariadb PORT DATADIR NAME SERVER_ID starts (initialising it first
# if needed) a private MariaDB on 127.0.0.1:PORT with the binary log
# (mysql-bin, ROW format, replicated changes logged too) and SERVER_ID;
# its socket, pid file and log are $state/NAME.*.
start_mariadb() {
  local port=$1 data=$2 name=$3 server_id=$4
  if mysql_ping "$port"; then
    return 0
  fi
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server mariadb-client
  if [ ! -d "$data/mysql" ]; then
    log "initialising a private MariaDB in $data"
    mkdir -p "$data"
    mariadb-install-db --no-defaults --datadir="$data" --user="$(id -un)" \
      --auth-root-authentication-method=normal >"$state/$name-install.log" 2>&1
  fi
  log "starting a private MariaDB on 127.0.0.1:$port"
  nohup /usr/sbin/mariadbd --no-defaults --datadir="$data" --user="$(id -un)" \
    --bind-address=127.0.0.1 --port="$port" --socket="$state/$name.sock" \
    --pid-file="$state/$name.pid" --log-bin=mysql-bin --server-id="$server_id" --binlog-format=ROW \
    --log-slave-updates --skip-name-resolve >"$state/$name.log" 2>&1 &
  wait_mysql "$port" || { log "MariaDB did not start; see $state/$name.log"; exit 1; }
}

# start_replica_mysql starts the private replica: port
# $replica_mysql_port, server_id 3, replicating from the binary log server
# ($binlog_mysql_port) with GTIDs (MASTER_USE_GTID=slave_pos). A new
# replica starts at the source's current GTID position: it replicates
# what is written from then on (each test creates its own database), not
# the source's history.
start_replica_mysql() {
  replica_ok=
  if [ -z "${binlog_mysql_port:-}" ]; then
    log "no MariaDB with the binary log: no replica; the replica fence tests will fail under CI"
    return 0
  fi
  start_mariadb "$replica_mysql_port" "$state/replica" replica 3
  local client pos
  client=$(command -v mariadb || command -v mysql)
  sql() { "$client" --protocol=tcp -h127.0.0.1 -P"$1" -uroot --connect-timeout=2 -N -B -e "$2"; }
  if [ -n "$(sql "$replica_mysql_port" 'SHOW SLAVE STATUS' 2>/dev/null)" ]; then
    # Set up before: restart the threads a test may have left stopped.
    sql "$replica_mysql_port" 'START SLAVE' 2>/dev/null || true
  else
    pos=$(sql "$binlog_mysql_port" 'SELECT @@gtid_binlog_pos')
    log "replica on 127.0.0.1:$replica_mysql_port: replicating from 127.0.0.1:$binlog_mysql_port from GTID position '$pos'"
    sql "$replica_mysql_port" "SET GLOBAL gtid_slave_pos = '$pos';
      CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$binlog_mysql_port, MASTER_USER='root',
        MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1;
      START SLAVE" || { log "cannot start replication on port $replica_mysql_port"; return 0; }
  fi
  replica_ok=1
  log "MariaDB replica listening on 127.0.0.1:$replica_mysql_port"
}

# mysql_binlog_on reports whether the server on port $1 has log_bin ON.
mysql_binlog_on() {
  local client
  client=$(command -v mariadb || command -v mysql) || return 1
  [ "$("$client" --protocol=tcp -h127.0.0.1 -P"$1" -uroot --connect-timeout=2 -N -B \
    -e 'SELECT @@log_bin' 2>/dev/null)" = 1 ]
}

# start_binlog_mysql finds a server with the binary log on: the main one
# when it has it, else the private instance (started in addition).
start_binlog_mysql() {
  if mysql_binlog_on "$mysql_port"; then
    binlog_mysql_port=$mysql_port
    return 0
  fi
  start_private_mysql
  if ! mysql_binlog_on "$private_mysql_port"; then
    log "MariaDB on port $private_mysql_port has no binary log; exact-counter tests will skip"
    binlog_mysql_port=
    return 0
  fi
  binlog_mysql_port=$private_mysql_port
  log "MariaDB with the binary log on listening on 127.0.0.1:$binlog_mysql_port"
}

# install_promtool installs Debian's prometheus package, which ships
# promtool, when promtool is missing: the unit tests of the alert rules
# (deploy/prometheus) run it.
install_promtool() {
  command -v promtool >/dev/null && return 0
  # The package's own server is not wanted: keep it from starting.
  local policy=/usr/sbin/policy-rc.d created=
  if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created=1
  fi
  apt_install prometheus || true
  [ -n "$created" ] && rm -f "$policy"
  command -v promtool >/dev/null || log "promtool is still missing; the alert rule tests will fail under CI"
}

# install_clients installs the other languages' memcached clients that the
# distribution tests (integration/distribution_test.go) read through.
install_clients() {
  local missing=()
  /usr/bin/python3 -c 'import pylibmc' 2>/dev/null || missing+=(python3-pylibmc)
  /usr/bin/python3 -c 'import pymemcache' 2>/dev/null || missing+=(python3-pymemcache)
  /usr/bin/python3 -c 'import pymysql' 2>/dev/null || missing+=(python3-pymysql)
  command -v php >/dev/null || missing+=(php-cli)
  command -v php >/dev/null && php -r 'exit(class_exists("Memcached") ? 0 : 1);' 2>/dev/null || missing+=(php-memcached)
  command -v php >/dev/null && php -r 'exit(in_array("mysql", PDO::getAvailableDrivers()) ? 0 : 1);' 2>/dev/null || missing+=(php-mysql)
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
}

write_env() {
  cat >"$state/env" <<ENV
CACHEWARDEN_TEST_MEMCACHED='127.0.0.1:$mc_port'
CACHEWARDEN_TEST_MYSQL_DSN='root@tcp(127.0.0.1:$mysql_port)/'
ENV
  if [ -n "${binlog_mysql_port:-}" ]; then
    echo "CACHEWARDEN_TEST_MYSQL_BINLOG_DSN='root@tcp(127.0.0.1:$binlog_mysql_port)/'" >>"$state/env"
  fi
  if [ -n "${with_second_mysql:-}" ] && mysql_binlog_on "$second_mysql_port"; then
    echo "CACHEWARDEN_TEST_MYSQL_BINLOG2_DSN='root@tcp(127.0.0.1:$second_mysql_port)/'" >>"$state/env"
  fi
  if [ -n "${replica_ok:-}" ]; then
    echo "CACHEWARDEN_TEST_MYSQL_REPLICA_DSN='root@tcp(127.0.0.1:$replica_mysql_port)/'" >>"$state/env"
  fi
  cat "$state/env"
}

# pid_alive FILE [PATTERN] reports whether FILE names a running process
# and, given PATTERN (a shell pattern), whether that process's command line
# matches it: a stale pid file whose number the kernel has given to some
# other process names no service of ours.
pid_alive() {
  [ -s "$1" ] || return 1
  local pid cmd
  pid=$(cat "$1")
  case "$pid" in ''|*[!0-9]*) return 1 ;; esac
  kill -0 "$pid" 2>/dev/null || return 1
  [ -z "${2:-}" ] && return 0
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  # shellcheck disable=SC2254 # $2 is a pattern on purpose
  case "$cmd" in $2) return 0 ;; esac
  return 1
}

# stop_pid FILE NAME PATTERN stops the process FILE names, if its command
# line matches PATTERN, and removes FILE. A process that is something else
# (a stale pid file) is left alone; one that outlives the wait is reported
# and makes the script fail.
stop_pid() {
  local file=$1 name=$2 pattern=$3
  [ -f "$file" ] || return 0
  if ! pid_alive "$file"; then
    rm -f "$file"
    return 0
  fi
  local pid
  pid=$(cat "$file")
  if ! pid_alive "$file" "$pattern"; then
    log "not stopping pid $pid: $file names it, but it is not $name (a stale pid file); removed the file"
    rm -f "$file"
    return 0
  fi
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name (pid $pid) still runs 15 s after SIGTERM; stop it by hand (kill -9 $pid)"
    return 1
  fi
  log "stopped $name (pid $pid)"
  rm -f "$file"
}

# The command lines of what this script starts, for stop_pid and status.
mc_pattern="memcached -d * -l 127.0.0.1 -p $mc_port *"
mysql_pattern() { echo "*mariadbd *--pid-file=$state/$1.pid *"; }
machine_mysql_pattern="*mariadbd*"

stop() {
  local failed=0
  stop_pid "$mc_pid_file" "memcached on 127.0.0.1:$mc_port" "$mc_pattern" || failed=1
  # The pid file of earlier versions of this script, if memcached could
  # write it.
  stop_pid "$state/memcached.pid" "memcached" "memcached *" || failed=1
  stop_pid "$state/mysql.pid" "the private MariaDB on 127.0.0.1:$private_mysql_port" "$(mysql_pattern mysql)" || failed=1
  stop_pid "$state/mysql2.pid" "the private MariaDB on 127.0.0.1:$second_mysql_port" "$(mysql_pattern mysql2)" || failed=1
  stop_pid "$state/replica.pid" "the private MariaDB replica on 127.0.0.1:$replica_mysql_port" "$(mysql_pattern replica)" || failed=1
  stop_pid "$state/machine-mariadb.pid" "the machine's MariaDB on 127.0.0.1:3306" "$machine_mysql_pattern" || failed=1
  return "$failed"
}

# status says what answers on the services' ports and who started it.
status() {
  local line
  describe() { # PORT NAME PIDFILE PATTERN
    if ! port_open "$1"; then
      return 0
    fi
    if pid_alive "$3" "$4"; then
      line="$2 on 127.0.0.1:$1 (started by scripts/services.sh, pid $(cat "$3"))"
    else
      line="$2 on 127.0.0.1:$1 (not started by this checkout's scripts/services.sh: services-stop leaves it)"
    fi
    echo "  $line"
  }
  echo "Services left running (stop them with \`make services-stop\`; it stops only those scripts/services.sh started):"
  {
    describe "$mc_port" memcached "$mc_pid_file" "$mc_pattern"
    describe 3306 MariaDB "$state/machine-mariadb.pid" "$machine_mysql_pattern"
    describe "$private_mysql_port" "MariaDB (private, binary log on)" "$state/mysql.pid" "$(mysql_pattern mysql)"
    describe "$second_mysql_port" "MariaDB (private, binary log on, failover target)" "$state/mysql2.pid" "$(mysql_pattern mysql2)"
    describe "$replica_mysql_port" "MariaDB (private replica of the binary log server)" "$state/replica.pid" "$(mysql_pattern replica)"
  } | grep . || echo "  none"
}

case "${1:-start}" in
  demo)
    start_memcached
    start_mysql
    write_env
    ;;
  demo-binlog)
    start_memcached
    start_mysql
    start_binlog_mysql
    write_env
    ;;
  bench)
    start_memcached
    start_mysql
    start_binlog_mysql
    start_replica_mysql
    write_env
    ;;
  start)
    start_memcached
    start_mysql
    start_binlog_mysql
    start_replica_mysql
    start_second_mysql
    with_second_mysql=1
    install_clients
    install_promtool
    write_env
    ;;
  stop) stop ;;
  status) status ;;
  env) cat "$state/env" ;;
  *) echo "usage: $0 [demo|demo-binlog|bench|start|stop|status|env]" >&2; exit 2 ;;
esac
