"""The journal's writes, and its writer: the proxy's hot-path writes, committed by a process of its own.

- `client.py`: the proxy's side (JournalClient): starts the writer, sends it requests, restarts it;
- `writer.py`: the writer process: group commit of what the proxy sends;
- `messages.py`: what they say to each other, and its framing;
- `writes.py`: record an intent, advance a receipt, the duplicate decision, on a driver connection: each
  defined once, for the writer and the store's general path alike;
- `statements.py`: their SQL, one definition for SQLite and PostgreSQL;
- `connection.py`: the writer's database connection and its transactions.
"""
