"""``python3 -m determined.launch.deepspeed ...`` runs ``launchers.deepspeed``."""

import sys

from launchers.deepspeed import main

if __name__ == "__main__":
    sys.exit(main())
