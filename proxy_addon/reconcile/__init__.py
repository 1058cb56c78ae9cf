"""Reconciliation: settle outcome_unknown receipts by reading the upstream, never by a blind write.

- decide.py: what a read found (ReadOutcome) and the verdict it gives; pure.
- rules.py: filling a rule's read from the receipt (URL placeholders, ${VAR} headers, match fields).
- strategies.py: the reads, one class per strategy (lookup, search, resend_with_key).
- worker.py: the worker (leases, concurrency, rate limits), `receipts reconcile`, and the in-proxy addon.
"""
