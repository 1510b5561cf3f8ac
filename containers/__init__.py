"""Apptainer/Singularity image handling and command wrapping."""
