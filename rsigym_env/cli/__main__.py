"""``python -m rsigym_env.cli ...``: the same as the ``rsigym`` console script."""

import sys

from . import main

if __name__ == "__main__":  # importing this module (e.g. to walk the package) runs nothing
    sys.exit(main())
