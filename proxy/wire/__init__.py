"""Wire adapters: pure decode/encode between an API's JSON and the neutral history model."""
