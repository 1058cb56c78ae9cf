"""The rules, pure: states, records, the intent and its fingerprint, redaction, accounts, verdicts, duplicates."""
