"""``determined.core`` → ``harness.core``."""

from harness.core import *  # noqa: F403
from harness.core import __all__ as __all__
