"""What one mechanism costs on its own: the audit chain (audit_chain.py), kept-alive connections (keepalive.py)."""
