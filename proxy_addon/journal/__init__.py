"""The journal writer: the proxy's hot-path writes, committed by a process of its own (issue 15).

- `client.py`: the proxy's side (JournalClient): starts the writer, sends it requests, restarts it;
- `writer.py`: the writer process: group commit of what the proxy sends;
- `messages.py`: what they say to each other, and its framing;
- `hot_path.py`: record an intent, advance a receipt, on a driver connection;
- `statements.py`: the SQL of both, one definition for SQLite and PostgreSQL;
- `connection.py`: the writer's database connection and its transactions.
"""
