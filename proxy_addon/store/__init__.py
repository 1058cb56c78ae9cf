"""The receipt store: the only code that reads or writes the journal's tables, split by concern.

`ReceiptStore(engine)` holds one part per concern, each a small interface over one `Database`:
- `receipts`: the write path (record, submit, transition), the duplicate decision's query, reads;
- `instances`: proxy instances and the recovery of dead ones' receipts;
- `queue`: the reconcile queue (leases);
- `refusals`: refused and replayed duplicates;
- `retention`: counts and pruning;
- `scrub`: rows from earlier versions redacted again with today's rules (`receipts scrub`).
"""

from sqlalchemy import Engine

from proxy_addon.store.database import Database
from proxy_addon.store.instances import Instances
from proxy_addon.store.queue import ReconcileQueue
from proxy_addon.store.receipts import Receipts
from proxy_addon.store.refusals import Refusals
from proxy_addon.store.retention import Retention
from proxy_addon.store.scrub import Scrubber


class ReceiptStore:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.db = Database(engine)
        self.receipts = Receipts(self.db)
        self.instances = Instances(self.db, self.receipts)
        self.queue = ReconcileQueue(self.db, self.receipts)
        self.refusals = Refusals(self.db)
        self.retention = Retention(self.db)
        self.scrub = Scrubber(self.db)
