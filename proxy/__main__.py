"""`python -m proxy` is the `compaction-proxy` command."""

import sys

from proxy.cli import main

sys.exit(main())
