"""The only code that talks to Slurm (sbatch/squeue/sacct/scontrol) and maps its job states."""
