"""``python -m dataloaderx``."""

import sys

from dataloaderx.cli import main

sys.exit(main())
