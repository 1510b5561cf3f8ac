"""The helper's command: ``python -I -S /…/userhelper/run.py --root DIR …`` (a script path, so that an editable
install and a wheel run it alike: ``-I`` leaves the script's own directory off ``sys.path`` and ``-S`` every
site directory, and this puts the directory it was installed in, root's, first: it imports the standard library,
``userfiles`` and itself, nothing else)."""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from userhelper.main import main

    sys.exit(main(sys.argv[1:]))
