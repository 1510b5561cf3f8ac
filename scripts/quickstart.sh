#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine (run as root):
#   1. install (scripts/bootstrap.sh) and scikit-learn for the examples;
#   2. bring up a 2-node local Slurm cluster with 2 fake GPUs per node and a `researcher` account;
#   3. start a master as a daemon on the cluster's bridge (state, admin password, jobs and checkpoints in
#      /var/lib/hpc-det/quickstart);
#   4. create a master user mapped to the researcher's Unix account;
#   5. as the researcher, run the digits CNN's adaptive ASHA search (examples/digits_pytorch/adaptive.yaml)
#      on Slurm and wait for it;
#   6. print the best trial's validation accuracy, its checkpoint and the commands to try next.
# Re-runnable: a cluster, master or user that is already there is reused; each run creates a new experiment.
# The master's state (DET_QUICKSTART_DIR) survives `det deploy local down`: after `up`, a new run restarts the
# master if it is not running, and finds its users, experiments and checkpoints again.
#   scripts/quickstart.sh     # as root (another user: through sudo)
# Environment: DET_QUICKSTART_USER (researcher), DET_QUICKSTART_PORT (8080; the web UI's HTTPS port:
#   DET_QUICKSTART_UI_PORT, 8443), DET_QUICKSTART_DIR,
#   DET_QUICKSTART_CONFIG (adaptive.yaml; another of examples/digits_pytorch, e.g. const.yaml: one trial).
set -euo pipefail
source "$(dirname "$0")/_as_root.sh"
cd "$(dirname "$0")/.."
REPO=$PWD
VENV=$REPO/.venv
USER_NAME=${DET_QUICKSTART_USER:-researcher}
PORT=${DET_QUICKSTART_PORT:-8080}
UI_PORT=${DET_QUICKSTART_UI_PORT:-8443}
STATE=${DET_QUICKSTART_DIR:-/var/lib/hpc-det/quickstart}
CONFIG=${DET_QUICKSTART_CONFIG:-adaptive.yaml}
MIN_ACCURACY=0.9
T0=$(date +%s)

step() { printf '\n==> [%3ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() {
  echo "quickstart: $*" >&2
  exit 1
}
[ -f "examples/digits_pytorch/$CONFIG" ] || die "DET_QUICKSTART_CONFIG: no examples/digits_pytorch/$CONFIG"

step "Installing (scripts/bootstrap.sh)"
scripts/bootstrap.sh
if ! "$VENV/bin/python" -c 'import sklearn' 2>/dev/null; then
  echo "installing scikit-learn into $VENV for the examples"
  "$VENV/bin/pip" install -q --disable-pip-version-check 'scikit-learn>=1.3' || die "pip could not install scikit-learn"
fi
export PATH="$VENV/bin:$PATH"

step "Local Slurm cluster: 2 nodes x 2 GPUs, account '$USER_NAME'"
if det deploy local status --json >/dev/null 2>&1; then  # 0 only when up and healthy; `up` replaces a stale one
  echo "already up: reusing it"
else
  det deploy local up --nodes 2 --gpus-per-node 2 --create-user "$USER_NAME"
fi
id "$USER_NAME" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$USER_NAME"
USER_HOME=$(getent passwd "$USER_NAME" | cut -d: -f6)
[ -d "$USER_HOME" ] || install -d -o "$USER_NAME" -g "$USER_NAME" -m 0755 "$USER_HOME"
HOST=$(python -c 'import json
from local_cluster.spec import LocalClusterSpec, get_state_dir
record = json.loads((get_state_dir() / "state.json").read_text())
print(LocalClusterSpec.from_json(record["spec"]).controller_ip)') || die "cannot read the cluster's bridge address"
URL=http://$HOST:$PORT
sinfo -N -o '%N %P %T %G' | sed 's/^/  /'
# Jobs run the project's interpreter and harness as the researcher: the checkout must be readable to them.
(cd / && runuser -u "$USER_NAME" -- env PYTHONPATH="$REPO" "$VENV/bin/python" -c 'import harness, launchers, sklearn') ||
  die "the account '$USER_NAME' cannot run $VENV/bin/python with $REPO; put the checkout where every user can read it (e.g. /opt/hpc-det)"

step "Master on $URL (state in $STATE)"
install -d -m 0755 "$STATE" "$STATE/data" "$STATE/jobs"
install -d -m 1777 "$STATE/checkpoints"
new_secret() { (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$1"); }
[ -s "$STATE/admin.password" ] || new_secret "$STATE/admin.password"
[ -s "$STATE/$USER_NAME.password" ] || new_secret "$STATE/$USER_NAME.password"
chmod 600 "$STATE/admin.password" "$STATE/$USER_NAME.password"
cat >"$STATE/master.yaml" <<EOF
# Written by scripts/quickstart.sh. The master listens on the local cluster's bridge so jobs on the nodes reach it.
listen: {host: $HOST, port: $PORT}
external_url: $URL
# Browsers get the web UI over HTTPS on a port of its own, with a certificate the master generates (in tls/).
tls: {browser_port: $UI_PORT}
db: {url: "sqlite:///$STATE/data/master.db"}
job_storage_root: $STATE/jobs
checkpoint_storage: {host_path: $STATE/checkpoints}
resource_pools:
  default: {partition: batch, slots_per_node: 2, gpu_request_style: gres}
preemption: {signal: SIGUSR1, lead_time_s: 30}
poll_interval_s: 1
EOF
export DET_MASTER_DATA_DIR=$STATE/data DET_MASTER_STATE_DIR=$STATE
master_up() { python -c 'import sys, httpx; httpx.get(sys.argv[1], timeout=2).raise_for_status()' "$URL/api/v1/master" 2>/dev/null; }
if master_up; then
  echo "already running: reusing it"
else
  # The master of an earlier run that no longer answers is restarted; a pid file left by one that is gone (a
  # reboot) is dropped. Its database, passwords and checkpoints in $STATE are reused as they are.
  pid=$(cat "$STATE/master.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && grep -qa 'hpc_master\.server' "/proc/$pid/cmdline" 2>/dev/null; then
    echo "the master of an earlier run (pid $pid) does not answer: restarting it"
    det-master --stop || die "could not stop the master (pid $pid)"
  else
    rm -f "$STATE/master.pid"
  fi
  if [ -s "$STATE/data/master.db" ]; then echo "starting it on its existing state: $STATE/data/master.db"; fi
  DET_ADMIN_PASSWORD=$(cat "$STATE/admin.password") det-master --config "$STATE/master.yaml" --daemon ||
    die "the master did not start; see $STATE/master.log"
  for _ in $(seq 60); do master_up && break || sleep 0.5; done
  master_up || die "the master does not answer on $URL; see $STATE/master.log"
fi
echo "admin password: $STATE/admin.password (mode 0600); log: $STATE/master.log"

step "Master user '$USER_NAME' (jobs run as the Unix account '$USER_NAME')"
admin() { DET_MASTER=$URL DET_USER=admin DET_PASS=$(cat "$STATE/admin.password") det "$@"; }
if admin user list --json | python -c 'import json, sys; sys.exit(sys.argv[1] not in [u["username"] for u in json.load(sys.stdin)["users"]])' "$USER_NAME"; then
  echo "already exists: reusing it"
else
  admin user create "$USER_NAME" --unix-username "$USER_NAME" --password "$(cat "$STATE/$USER_NAME.password")"
fi

# The researcher works from a copy of the example they own (the checkout may be root's).
WORK=$(runuser -u "$USER_NAME" -- mktemp -d /var/tmp/hpc-det-quickstart.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
tar -C examples --exclude=__pycache__ -cf - digits_pytorch | tar -C "$WORK" -xf -
chown -R "$USER_NAME:" "$WORK"
as_researcher() {
  (cd "$WORK" && runuser -u "$USER_NAME" -- env HOME="$USER_HOME" PATH="$VENV/bin:/usr/bin:/bin" DET_MASTER="$URL" \
    DET_USER="$USER_NAME" DET_PASS="$(cat "$STATE/$USER_NAME.password")" "$@")
}
as_researcher det user login "$USER_NAME" >/dev/null || die "'$USER_NAME' cannot log in to the master"

step "As '$USER_NAME': det e create examples/digits_pytorch/$CONFIG examples/digits_pytorch -f"
if [ "$CONFIG" = adaptive.yaml ]; then
  echo "(adaptive ASHA: 12 trials over learning rate, filters and dropout, 4 at a time; the first trial's logs follow)"
fi
as_researcher det e create "digits_pytorch/$CONFIG" digits_pytorch -f | tee "$WORK/create.log" ||
  die "the first trial did not complete (exit $?); see the logs above"
EXP=$(sed -n 's/^Created experiment \([0-9]*\)$/\1/p' "$WORK/create.log")
[ -n "$EXP" ] || die "no experiment id in the output of det e create"

step "Waiting for experiment $EXP: det e wait $EXP"
as_researcher det e wait "$EXP" || die "experiment $EXP did not complete; try: det e describe $EXP"
as_researcher det e list-trials "$EXP"

step "The best trial: det e list-checkpoints --best 1 $EXP"
as_researcher det e list-checkpoints --best 1 "$EXP"
read -r TRIAL UUID STEPS ACC < <(as_researcher det e list-checkpoints --best 1 "$EXP" --json | python -c '
import json, sys
(c,) = json.load(sys.stdin)["checkpoints"]
print(c["training"]["trialId"], c["uuid"], c["stepsCompleted"], c["training"]["searcherMetric"])') ||
  die "experiment $EXP has no checkpoint"
python -c 'import sys; sys.exit(float(sys.argv[1]) < float(sys.argv[2]))' "$ACC" "$MIN_ACCURACY" ||
  die "the best validation accuracy is $ACC, below $MIN_ACCURACY: the example is broken"

ELAPSED=$(($(date +%s) - T0))
UI_URL=https://$HOST:$UI_PORT
FINGERPRINT=$(openssl x509 -in "$STATE/tls/browser.crt" -noout -fingerprint -sha256 | cut -d= -f2)
cat <<EOF

Done in ${ELAPSED}s. Experiment $EXP (digits CNN, $CONFIG) COMPLETED on the 2-node Slurm cluster.
Best trial $TRIAL: validation_accuracy $ACC after $STEPS batches.
Its checkpoint: $UUID
  in $STATE/checkpoints/$UUID

The web UI: $UI_URL/
  log in as $USER_NAME, with the password in $STATE/$USER_NAME.password (admin: $STATE/admin.password)
  Its certificate is the master's own ($STATE/tls/browser.crt), so the browser warns once; its
  SHA-256 fingerprint, to compare with the browser's: $FINGERPRINT

Try next, as the researcher (already logged in; the master and the cluster stay up):
  su - $USER_NAME
  export PATH=$VENV/bin:\$PATH DET_MASTER=$URL
  det e list-checkpoints --best 1 $EXP
  det trial logs $TRIAL
  det t describe $TRIAL --metrics
  cp -r $REPO/examples ~/examples && cd ~/examples/digits_pytorch
  det e create distributed.yaml . -f     # one trial on 4 slots: 4 ranks on node1 and node2
Stop the master: DET_MASTER_STATE_DIR=$STATE $VENV/bin/det-master --stop
Remove the cluster: $VENV/bin/det deploy local down
  (the master's database, passwords and checkpoints in $STATE stay; after \`det deploy local up\`,
  run this script again and it finds them)
EOF
