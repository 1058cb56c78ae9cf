"""The audit trail: a hash chain over each receipt's history, signed checkpoints over all chains' heads, and
their verification (`receipts verify`, `receipts checkpoint`)."""
