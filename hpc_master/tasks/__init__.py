"""Interactive tasks: commands, notebooks, shells and TensorBoards, each one Slurm job reached through the master."""
