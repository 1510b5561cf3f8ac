"""``python -I -m userhelper --root DIR …`` (an installed copy)."""

import sys

from userhelper.main import main

sys.exit(main(sys.argv[1:]))
