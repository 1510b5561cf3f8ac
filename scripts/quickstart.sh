#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine (run as root): install, bring up a 2-node local Slurm
# cluster with fake GPUs, and run a 2-node x 2-task job as a non-root researcher, printing what each rank saw.
#   sudo scripts/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: sudo $0" >&2; exit 2; }
scripts/bootstrap.sh >/dev/null
export PATH="$PWD/.venv/bin:$PATH"
USER_NAME=${DET_QUICKSTART_USER:-researcher}
det deploy local status >/dev/null 2>&1 || det deploy local up --nodes 2 --gpus-per-node 2 --create-user "$USER_NAME"
id "$USER_NAME" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$USER_NAME"

work=$(runuser -u "$USER_NAME" -- mktemp -d /var/tmp/hpc-det-quickstart.XXXXXX)
cat > "$work/job.sh" <<'JOB'
#!/bin/bash
#SBATCH --job-name=quickstart --nodes=2 --ntasks-per-node=2 --gres=gpu:2 --time=5
srun bash -c 'echo "rank $SLURM_PROCID on $(hostname) ($(hostname -I | tr -d " ")): CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_STEP_GPUS=$SLURM_STEP_GPUS user=$(id -un)"' | sort
JOB
chown "$USER_NAME" "$work/job.sh"
job=$(runuser -u "$USER_NAME" -- sbatch --parsable --chdir "$work" --output "$work/out.txt" --wait "$work/job.sh")
echo "Slurm job $job ran as $USER_NAME on the local cluster; what each rank saw:"
cat "$work/out.txt"
rm -rf "$work"
echo "The cluster stays up: try 'sinfo', or 'sudo det deploy local down' to remove it."
