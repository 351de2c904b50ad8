"""Files: atomic writes, Arrow IPC stream shards, hashes."""
