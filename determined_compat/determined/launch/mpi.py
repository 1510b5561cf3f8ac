"""``python3 -m determined.launch.mpi ...`` runs ``launchers.mpi``."""

import sys

from launchers.mpi import main

if __name__ == "__main__":
    sys.exit(main())
