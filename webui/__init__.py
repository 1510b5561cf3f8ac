"""The web UI's static assets (HTML, ES modules, CSS, vendored uPlot), served by the master at ``/``."""

from pathlib import Path

ASSETS_DIR = Path(__file__).parent
