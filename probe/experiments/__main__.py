"""``python -m probe.experiments NAME --out DIR [options]`` (see ``probe.experiments.command``)."""

import sys

from probe.experiments.command import main

if __name__ == "__main__":
    sys.exit(main())
