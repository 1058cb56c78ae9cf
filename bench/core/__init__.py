"""The shared core: processes, the loopback upstream and load client, databases, usage from /proc, the machine."""
