"""A throwaway multi-node Slurm cluster on one machine, for trying and testing (`det deploy local`)."""
