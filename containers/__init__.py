"""Apptainer/Singularity: ``exec`` command lines (``runtime``), image references and the pull cache (``images``),
and running a trial's work inside its image (``job``, ``node_exec``). ``python -m containers.prepull`` pulls an
image into a pool's cache ahead of time, on a login node. Standard library only, except ``prepull``."""
