"""The lifecycle loop: searcher actions → Slurm jobs → job states → trial states.

`searchers` drives each experiment's search method inside short DB transactions; `jobs` submits, polls and
finishes trial runs through `slurm_backend` with no transaction held across a Slurm call; `loop` runs both
periodically in the master process and reconciles everything with Slurm after a restart.
"""
