#!/usr/bin/env bash
# Real engines for `oodeval run --executor ray|slurm`, on this one machine, bound to 127.0.0.1:
#   ray:   a Ray head and a second Ray node (1 CPU each), GCS on 127.0.0.1:$RAY_PORT
#   slurm: munged, MariaDB (unix socket only, no TCP), slurmdbd (127.0.0.1:6819), slurmctld
#          (127.0.0.1:6817) and one slurmd (127.0.0.1:6818, 2 CPUs, partition "ci", KillWait=5)
# Usage: scripts/engines.sh install|start|stop|status [ray|slurm|slurmdbd]   (default: both engines)
#        scripts/engines.sh isolated COMMAND...   COMMAND in a private network namespace whose only
#             interface is loopback (root): Ray's servers listen on every interface of the namespace
#             they run in, so `start ray` refuses to run where the machine has any other address
#   install   Debian packages (root) and the Python ones (into $PY's environment); idempotent
#   start     start what is not running; every wait is bounded, a daemon that does not come up
#             prints its log and the script exits 1
#   stop      stop what this script started, each by its own command (ray: the `ray start --block`
#             supervisor it started; munged --stop, mariadb-admin shutdown, sacctmgr shutdown,
#             scontrol shutdown), never another user's or engineer's instance
#   status    exit 0 when everything asked for is up
# `stop slurmdbd` / `start slurmdbd` take Slurm's accounting away and back (a Slurm without sacct).
# State, logs and configuration live in $ENGINES_DIR (default /tmp/oodeval-engines); Slurm's
# configuration goes to /etc/slurm (where its commands read it), refused if someone else's is there.
# Root is needed for Slurm (its daemons switch users); Ray runs as the calling user.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINES_DIR=${ENGINES_DIR:-/tmp/oodeval-engines}
PY=${PY:-.venv/bin/python}
RAY_PORT=${RAY_PORT:-6390}
WAIT=${ENGINES_WAIT:-60}          # seconds any one daemon may take to come up or go down
MARK="# written by oodeval scripts/engines.sh"
SLURM_ETC=/etc/slurm
export RAY_ADDRESS_FILE="$ENGINES_DIR/ray.address"

say() { echo "engines: $*"; }
die() { echo "engines: error: $*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# wait_for SECONDS LOG DESCRIPTION COMMAND...: run COMMAND until it succeeds; on time-out print LOG, fail
wait_for() {
  local secs=$1 log=$2 what=$3; shift 3
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then
      echo "engines: error: $what did not come up within ${secs}s; its log ($log):" >&2
      tail -n 40 "$log" >&2 2>/dev/null || echo "  (no log)" >&2
      exit 1
    fi
    sleep 0.5
  done
}
wait_gone() {  # wait_gone SECONDS PIDFILE WHAT
  local end=$((SECONDS + $1))
  while alive "$2"; do
    [ "$SECONDS" -ge "$end" ] && die "$3 (pid $(cat "$2")) did not stop within $1 s"
    sleep 0.5
  done
  rm -f "$2"
}

# ---------------------------------------------------------------------------------------- install
install() {
  if [ "$(id -u)" = 0 ]; then
    local missing="" pkg
    for pkg in munge mariadb-server slurmdbd slurmctld slurmd slurm-client; do
      dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then
      say "installing Debian packages:$missing"
      local guard=""
      if [ ! -e /usr/sbin/policy-rc.d ]; then  # no daemon is started by the packages' install scripts
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && guard=1
      fi
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
      [ -n "$guard" ] && rm -f /usr/sbin/policy-rc.d
    fi
  else
    say "not root: Debian packages (Slurm, munge, MariaDB) not installed"
  fi
  "$PY" -c "import ray, submitit" 2>/dev/null || "$PY" -m pip install -q -c constraints.txt "ray" "submitit"
}

# -------------------------------------------------------------------------------------------- ray
RAY_DIR="$ENGINES_DIR/ray"
ray_bin() { echo "$(dirname "$PY")/ray"; }
ray_up() { alive "$ENGINES_DIR/ray-head.pid" && alive "$ENGINES_DIR/ray-node.pid" && [ -f "$RAY_ADDRESS_FILE" ] &&
           "$PY" - "$(cat "$RAY_ADDRESS_FILE")" <<'EOF'
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
alive = [n for n in ray.nodes() if n["Alive"]]
ray.shutdown()
sys.exit(0 if len(alive) >= 2 else 1)
EOF
}
ray_start() {
  if [ -z "${ENGINES_ISOLATED:-}" ] && ip -4 -o addr show scope global 2>/dev/null | grep -q inet; then
    die "this network namespace has addresses besides 127.0.0.1 and Ray would listen on them: run the engines and their clients inside \`$0 isolated COMMAND...\`"
  fi
  mkdir -p "$RAY_DIR"
  # Ray >= 2.5x turns token authentication on when ~/.ray/auth_token exists (a local Ray instance
  # leaves it): then every process that connects needs RAY_AUTH_MODE=token
  [ -f "$HOME/.ray/auth_token" ] && export RAY_AUTH_MODE=token
  local common=(--node-ip-address=127.0.0.1 --num-cpus=1 --disable-usage-stats --block)
  if ! alive "$ENGINES_DIR/ray-head.pid"; then
    say "starting the Ray head on 127.0.0.1:$RAY_PORT"
    setsid "$(ray_bin)" start --head --port="$RAY_PORT" --temp-dir="$RAY_DIR" --include-dashboard=false \
      "${common[@]}" >"$ENGINES_DIR/ray-head.log" 2>&1 &
    echo $! >"$ENGINES_DIR/ray-head.pid"
    echo "127.0.0.1:$RAY_PORT" >"$RAY_ADDRESS_FILE"
    wait_for "$WAIT" "$ENGINES_DIR/ray-head.log" "the Ray head" "$(ray_bin)" status --address="127.0.0.1:$RAY_PORT"
  fi
  if ! alive "$ENGINES_DIR/ray-node.pid"; then
    say "starting a second Ray node"
    setsid "$(ray_bin)" start --address="127.0.0.1:$RAY_PORT" "${common[@]}" >"$ENGINES_DIR/ray-node.log" 2>&1 &
    echo $! >"$ENGINES_DIR/ray-node.pid"
  fi
  wait_for "$WAIT" "$ENGINES_DIR/ray-node.log" "the second Ray node" ray_up
  say "ray up: address=$(cat "$RAY_ADDRESS_FILE")${RAY_AUTH_MODE:+ (RAY_AUTH_MODE=$RAY_AUTH_MODE)}"
}
ray_stop() {
  local f
  for f in ray-node ray-head; do  # on SIGTERM `ray start --block` stops the Ray processes it started, then exits
    alive "$ENGINES_DIR/$f.pid" && { say "stopping $f"; kill -TERM "$(cat "$ENGINES_DIR/$f.pid")"; wait_gone "$WAIT" "$ENGINES_DIR/$f.pid" "$f"; }
    rm -f "$ENGINES_DIR/$f.pid"
  done
  rm -f "$RAY_ADDRESS_FILE"
}

# ------------------------------------------------------------------------------------------ slurm
need_root() { [ "$(id -u)" = 0 ] || die "Slurm needs root (its daemons switch users)"; }
MYSQL_SOCK=/run/mysqld/mysqld.sock
slurm_conf() {
  if [ -f "$SLURM_ETC/slurm.conf" ] && ! grep -qx "$MARK" "$SLURM_ETC/slurm.conf"; then
    die "$SLURM_ETC/slurm.conf exists and is not this script's: refusing to replace a real cluster's configuration"
  fi
  mkdir -p "$SLURM_ETC" "$ENGINES_DIR/slurm/state" "$ENGINES_DIR/slurm/spool"
  chown slurm:slurm "$ENGINES_DIR/slurm/state"
  cat >"$SLURM_ETC/slurm.conf" <<EOF
$MARK
ClusterName=oodeval-ci
SlurmctldHost=localhost(127.0.0.1)
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$ENGINES_DIR/slurm/state
SlurmdSpoolDir=$ENGINES_DIR/slurm/spool
SlurmctldPidFile=$ENGINES_DIR/slurmctld.pid
SlurmdPidFile=$ENGINES_DIR/slurmd.pid
SlurmctldLogFile=$ENGINES_DIR/slurmctld.log
SlurmdLogFile=$ENGINES_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=ci Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$SLURM_ETC/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
PidFile=$ENGINES_DIR/slurmdbd.pid
LogFile=$ENGINES_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=oodeval-ci
StorageLoc=slurm_acct_db
EOF
  chown slurm:slurm "$SLURM_ETC/slurmdbd.conf"
  chmod 600 "$SLURM_ETC/slurmdbd.conf"
  touch "$ENGINES_DIR/slurmdbd.log" "$ENGINES_DIR/slurmctld.log"
  chown slurm:slurm "$ENGINES_DIR/slurmdbd.log" "$ENGINES_DIR/slurmctld.log"
}
munge_up() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
munge_start() {
  munge_up && return 0
  [ -f /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  mkdir -p /run/munge && chown munge:munge /run/munge
  say "starting munged"
  mkdir -p /var/log/munge && chown munge:munge /var/log/munge  # munged refuses a log file not its own
  runuser -u munge -- munged 2>>"$ENGINES_DIR/munged.err" ||
    { cat "$ENGINES_DIR/munged.err" >&2; tail -n 40 /var/log/munge/munged.log >&2; die "munged did not start"; }
  touch "$ENGINES_DIR/munged.ours"
  wait_for "$WAIT" /var/log/munge/munged.log munged munge_up
}
mysql_up() { mariadb-admin --socket="$MYSQL_SOCK" ping; }
mysql_start() {
  mysql_up >/dev/null 2>&1 && return 0
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >"$ENGINES_DIR/mariadb.log" 2>&1
  say "starting MariaDB (unix socket only)"
  setsid runuser -u mysql -- mariadbd --skip-networking --socket="$MYSQL_SOCK" --pid-file=/run/mysqld/mysqld.pid \
    --log-error="$ENGINES_DIR/mariadb.log" >/dev/null 2>&1 &
  touch "$ENGINES_DIR/mariadb.ours"
  wait_for "$WAIT" "$ENGINES_DIR/mariadb.log" MariaDB mysql_up
  mariadb --socket="$MYSQL_SOCK" -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'oodeval-ci';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}
dbd_up() { sacctmgr -i -n list cluster format=cluster; }
dbd_start() {
  alive "$ENGINES_DIR/slurmdbd.pid" && dbd_up >/dev/null 2>&1 && return 0
  say "starting slurmdbd"
  slurmdbd || { tail -n 40 "$ENGINES_DIR/slurmdbd.log" >&2; die "slurmdbd did not start"; }
  wait_for "$WAIT" "$ENGINES_DIR/slurmdbd.log" slurmdbd dbd_up
  sacctmgr -i -n list cluster format=cluster | grep -qw oodeval-ci || sacctmgr -i add cluster oodeval-ci >/dev/null
}
ctld_up() { scontrol ping | grep -q "is UP"; }
node_up() { sinfo -h -n localhost -o %t | grep -Eq "^(idle|mix|alloc)"; }
slurm_start() {
  need_root
  mkdir -p "$ENGINES_DIR"
  slurm_conf
  munge_start
  mysql_start
  dbd_start
  if ! alive "$ENGINES_DIR/slurmctld.pid"; then
    say "starting slurmctld"
    slurmctld || { tail -n 40 "$ENGINES_DIR/slurmctld.log" >&2; die "slurmctld did not start"; }
  fi
  wait_for "$WAIT" "$ENGINES_DIR/slurmctld.log" slurmctld ctld_up
  if ! alive "$ENGINES_DIR/slurmd.pid"; then
    say "starting slurmd"
    slurmd || { tail -n 40 "$ENGINES_DIR/slurmd.log" >&2; die "slurmd did not start"; }
  fi
  wait_for "$WAIT" "$ENGINES_DIR/slurmd.log" "slurmd (node localhost idle)" node_up
  say "slurm up: partition ci, accounting on"
}
slurm_stop() {
  need_root
  if alive "$ENGINES_DIR/slurmctld.pid"; then
    say "stopping slurmctld and slurmd"
    scancel --partition=ci --quiet 2>/dev/null || true
    scontrol shutdown >/dev/null  # the controller and every slurmd
    wait_gone "$WAIT" "$ENGINES_DIR/slurmctld.pid" slurmctld
  fi
  if alive "$ENGINES_DIR/slurmd.pid"; then  # a slurmd whose controller was gone already
    slurmd_pid=$(cat "$ENGINES_DIR/slurmd.pid"); kill -TERM "$slurmd_pid"; wait_gone "$WAIT" "$ENGINES_DIR/slurmd.pid" slurmd
  fi
  dbd_stop
  if [ -f "$ENGINES_DIR/mariadb.ours" ]; then
    say "stopping MariaDB"
    mariadb-admin --socket="$MYSQL_SOCK" shutdown 2>/dev/null || true
    wait_gone "$WAIT" /run/mysqld/mysqld.pid MariaDB
    rm -f "$ENGINES_DIR/mariadb.ours"
  fi
  if [ -f "$ENGINES_DIR/munged.ours" ]; then
    say "stopping munged"
    runuser -u munge -- munged --stop >/dev/null 2>&1 || true
    rm -f "$ENGINES_DIR/munged.ours"
  fi
  local f
  for f in slurm.conf slurmdbd.conf; do  # this script's configuration only (its first line marks it)
    [ -f "$SLURM_ETC/$f" ] && [ "$(head -n 1 "$SLURM_ETC/$f")" = "$MARK" ] && rm -f "$SLURM_ETC/$f"
  done
  return 0
}
dbd_stop() {
  if alive "$ENGINES_DIR/slurmdbd.pid"; then
    say "stopping slurmdbd"
    sacctmgr -i shutdown >/dev/null 2>&1 || kill -TERM "$(cat "$ENGINES_DIR/slurmdbd.pid")"
    wait_gone "$WAIT" "$ENGINES_DIR/slurmdbd.pid" slurmdbd
  fi
}

# ------------------------------------------------------------------------------------------- main
action=${1:-status}
if [ "$action" = isolated ]; then
  shift
  [ "$#" -gt 0 ] || die "usage: $0 isolated COMMAND..."
  # loopback up, plus one private address on it: Slurm resolves nothing (not even 127.0.0.1) where
  # the host has no address but loopback; no interface of this namespace reaches anything outside it
  exec unshare --net -- env ENGINES_ISOLATED=1 bash -c 'ip link set lo up && ip addr add 10.254.254.254/32 dev lo && exec "$@"' isolated "$@"
fi
what=${2:-all}
mkdir -p "$ENGINES_DIR"
case "$action/$what" in
  install/*) install ;;
  start/ray) ray_start ;;
  start/slurm) slurm_start ;;
  start/slurmdbd) need_root; dbd_start ;;
  start/all) ray_start; slurm_start ;;
  stop/ray) ray_stop ;;
  stop/slurm) slurm_stop ;;
  stop/slurmdbd) need_root; dbd_stop ;;
  stop/all) ray_stop; [ "$(id -u)" = 0 ] && slurm_stop || true ;;
  status/ray) ray_up >/dev/null 2>&1 && say "ray up at $(cat "$RAY_ADDRESS_FILE")" || { say "ray down"; exit 1; } ;;
  status/slurm) ctld_up 2>/dev/null && node_up 2>/dev/null && say "slurm up" || { say "slurm down"; exit 1; } ;;
  status/all) "$0" status ray && "$0" status slurm ;;
  *) die "usage: $0 install|start|stop|status [ray|slurm|slurmdbd]" ;;
esac
