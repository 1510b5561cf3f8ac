"""``python3 -m determined.launch.wrap_rank ...`` runs ``launchers.wrap_rank``."""

import sys

from launchers.wrap_rank import main

if __name__ == "__main__":
    sys.exit(main())
