"""The host spec: what an inventory may say, each value through a strict grammar (pydantic)."""
