"""The receipt store: the only code that reads or writes the journal's tables, split by concern.

`ReceiptStore(engine)` holds one part per concern, each a small interface over one `Database`:
- `receipts`: the general write path (record, submit, transition: journal/writes.py), the duplicate
  decision for the proof, reads;
- `instances`: proxy instances and the recovery of dead ones' receipts;
- `queue`: the reconcile queue (leases);
- `refusals`: refused and replayed duplicates;
- `retention`: counts and pruning;
- `scrub`: rows from earlier versions redacted again with today's rules (`receipts scrub`);
- `audit`: the audit trail's chains, checkpoints and events (`receipts verify`, `receipts checkpoint`);
- `controls`: the runs of the read rules' verifier controls, and the known successes they are run on;
- `approvals`: a person's approvals of writes that need one: list, show, approve, deny;
- `overview`: the journal at a glance (the last hour's writes, instances, approvals' waits), read cheaply.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine


class ReceiptStore:
    def __init__(self, engine: "Engine"):
        # The parts are imported when a store is made, not with this package: a module that imports it for the
        # name alone pays for none of them (the journal writer process imports journal/, never the store).
        from proxy_addon.store.approvals import Approvals
        from proxy_addon.store.audit import AuditTrail
        from proxy_addon.store.controls import ControlRuns
        from proxy_addon.store.database import Database
        from proxy_addon.store.instances import Instances
        from proxy_addon.store.overview import Overview
        from proxy_addon.store.queue import ReconcileQueue
        from proxy_addon.store.receipts import StoredReceipts
        from proxy_addon.store.refusals import Refusals
        from proxy_addon.store.retention import Retention
        from proxy_addon.store.scrub import Scrubber

        self.engine = engine
        self.db = Database(engine)
        self.receipts = StoredReceipts(self.db)
        self.instances = Instances(self.db, self.receipts)
        self.queue = ReconcileQueue(self.db, self.receipts)
        self.refusals = Refusals(self.db)
        self.retention = Retention(self.db)
        self.scrub = Scrubber(self.db)
        self.audit = AuditTrail(self.db)
        self.controls = ControlRuns(self.db)
        self.approvals = Approvals(self.db)
        self.overview = Overview(self.db)
