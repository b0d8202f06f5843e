"""The aiohttp shell: routes, the upstream client, byte relay, health endpoints."""
