"""Apptainer/Singularity: ``exec`` command lines (``runtime``), image references and the pull cache (``images``),
and running a trial's work inside its image (``job``, ``node_exec``). ``python -m containers.prepull`` pulls an
image into a cache ahead of time, on a login node (``python -m hpc_master.prepull`` takes the pool's runtime and
cache from ``master.yaml``). Standard library only; imports nothing of the master."""
