"""The per-user helper: what the master does in a researcher's name, run as that researcher.

A shared master never touches what its users control with its own rights: their run directories, their Slurm
jobs, their checkpoints. It runs this program as the user instead (``runuser -u USER --`` when the master is
root, ``sudo -n -u USER --`` from a service account, through the one sudoers rule ``det-master
--print-sudoers`` writes), and the program does the work with the user's rights only:

    python -I -S /…/userhelper/run.py --root /shared/hpc-det/jobs --root /shared/hpc-det/checkpoints

Its roots come from its command line (the sudoers rule names that exact line: a service account cannot widen
them), may name the user (``/scratch/{unix_user}/hpc-det``), and every path of a request must lie beneath one
of them, walked without following a link (``userfiles``). Requests are JSON lines on stdin, one answer per
line on stdout, in order; no shell, no environment of the caller's (``-I``; sudo resets it), no site packages
(``-S``). Slurm commands are an allowlist of exact argument shapes (sbatch with the script on stdin, scancel,
scontrol's Nice).

Standard library and ``userfiles`` only, so that everything it runs is what root installed.
"""
