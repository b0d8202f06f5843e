"""The pure planning core: plain functions over plain data.

Nothing in this package may do I/O (no aiohttp, redis, asyncio, sockets, clocks);
tests/core/test_purity.py enforces it. The server layer carries out the plans made here.
"""
