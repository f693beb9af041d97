"""``python -m cblight``: the ``cblight`` command (``cblight.cli.main``)."""

import sys

from cblight.cli import main

if __name__ == "__main__":
    sys.exit(main())
