import sys

from probe.cli.main import main

sys.exit(main())
