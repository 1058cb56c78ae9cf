"""The file a plain mitmproxy loads: `mitmdump -s proxy_addon/addon.py --set receipts_config=config.yaml`.

The addons themselves are in addons/receipts.py; this is the path the contract names, and it stays put when they
move. In an install it lies inside site-packages: `receipts init` prints where.

mitmproxy loads a script by its path, outside any package. The directory holding this file's package goes first
on sys.path, so that the code beside this file is the code that runs, not another copy that happens to be
importable (an editable install of another checkout, say); in an install that directory is site-packages itself.
"""

import sys
from pathlib import Path

if "proxy_addon" not in sys.modules:  # loaded by path (mitmdump -s), not imported
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy_addon.addons.receipts import make_addons  # after the path above

addons = make_addons()  # new ones each time mitmproxy loads (or reloads) the script
