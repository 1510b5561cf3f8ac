"""What runs inside Slurm jobs: a Determined-compatible Core API, the Trial API, preemption handling."""
