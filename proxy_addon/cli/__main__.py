"""`python -m proxy_addon.cli`: the `receipts` command."""

import sys

from proxy_addon.cli import main

sys.exit(main())
