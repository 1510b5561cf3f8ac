"""``determined.launch.*`` → ``launchers.*``."""
