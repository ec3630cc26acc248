"""The prefetch buffer pool, defined once in ``schemas.buffer_pool`` (the contract with the runtime)."""

from schemas.buffer_pool import PoolEntry, PoolKey, Signature, build_pool, pool_bytes, signature

__all__ = ["PoolEntry", "PoolKey", "Signature", "build_pool", "pool_bytes", "signature"]
