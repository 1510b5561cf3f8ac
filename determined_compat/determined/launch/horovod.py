"""``python3 -m determined.launch.horovod ...`` runs ``launchers.horovod``."""

import sys

from launchers.horovod import main

if __name__ == "__main__":
    sys.exit(main())
