"""What people and tools are shown: documents, the journaled exchange, the terminal, the review."""
