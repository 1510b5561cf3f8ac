"""``python3 -m determined.launch.torch_distributed ...`` runs ``launchers.torch_distributed``."""

import sys

from launchers.torch_distributed import main

if __name__ == "__main__":
    sys.exit(main())
