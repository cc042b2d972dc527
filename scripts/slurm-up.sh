#!/usr/bin/env bash
# Brings up a one-host Slurm cluster on this machine for kiln's Slurm tests: installs Debian's
# slurm-wlm and munge when missing, writes a cluster config (slurmctld and slurmd here, all CPUs),
# starts the daemons and waits until `sinfo` shows the node idle. Idempotent: run it again and it
# says what was already there. Needs root (or sudo) the first time, to install and start daemons.
set -euo pipefail

say() { echo "slurm-up: $*"; }
die() { echo "slurm-up: error: $*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "run as root (or install sudo): it installs packages and starts daemons"
  SUDO="sudo"
fi

# 1. packages
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
  say "slurm-wlm and munge are installed"
else
  say "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# 2. munge key and daemon
if [ ! -s /etc/munge/munge.key ]; then
  say "creating /etc/munge/munge.key"
  $SUDO mkdir -p /etc/munge
  $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
$SUDO chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge 2>/dev/null || true
$SUDO chmod 0400 /etc/munge/munge.key
$SUDO mkdir -p /run/munge && $SUDO chown munge:munge /run/munge
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "munged is running"
else
  say "starting munged"
  $SUDO -u munge /usr/sbin/munged --force 2>/dev/null || $SUDO runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged did not start (see /var/log/munge/munged.log)"
fi

# 3. the cluster config: this host is controller and the one compute node
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(awk '/MemTotal/ { print int($2 / 1024 * 0.9) }' /proc/meminfo)"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
WANT="$(cat <<EOF
# written by kiln's scripts/slurm-up.sh: a one-host cluster for tests
ClusterName=kiln
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
KillWait=30
# a loaded 2-core test machine can stall slurmd for seconds: wait longer than the default 10 s
MessageTimeout=60
MinJobAge=3600
SchedulerParameters=bf_interval=1
JobRequeue=1
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)"
$SUDO mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [ -f "$CONF" ] && ! grep -q "written by kiln's scripts/slurm-up.sh" "$CONF"; then
  die "$CONF exists and was not written by this script: this machine has a Slurm set-up of its own, which is left alone (use it, or move the file away to let this script write a one-host cluster)"
fi
if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$WANT" ]; then
  say "$CONF is up to date ($HOST, $CPUS CPUs)"
  CHANGED=0
else
  say "writing $CONF ($HOST, $CPUS CPUs, ${MEM_MB} MB)"
  printf '%s\n' "$WANT" | $SUDO tee "$CONF" >/dev/null
  CHANGED=1
fi

# 4. the daemons
running() { pgrep -x "$1" >/dev/null; }
if [ "$CHANGED" = 1 ]; then
  for d in slurmctld slurmd; do
    if running "$d"; then say "restarting $d (the config changed)"; $SUDO pkill -x "$d" || true; fi
  done
  for _ in $(seq 50); do running slurmctld || running slurmd || break; sleep 0.1; done
fi
if running slurmctld; then say "slurmctld is running"; else say "starting slurmctld"; $SUDO /usr/sbin/slurmctld; fi
if running slurmd; then say "slurmd is running"; else say "starting slurmd"; $SUDO /usr/sbin/slurmd; fi

# 5. wait for the node
state=""
for _ in $(seq 150); do
  state="$(sinfo -h -n "$HOST" -o '%T' 2>/dev/null | head -n1 || true)"
  case "$state" in
    idle*|mixed*|allocated*) break ;;
    down*|drain*) $SUDO scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.2
done
case "$state" in
  idle*|mixed*|allocated*) say "ready: node $HOST is $state (sinfo); try \`srun -N1 hostname\`" ;;
  *) die "node $HOST is '${state:-unknown}' after 30 s (see /var/log/slurm/slurmctld.log and slurmd.log)" ;;
esac
