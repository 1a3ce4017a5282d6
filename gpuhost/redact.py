"""Values in messages: bounded, and never a secret (credentials in URLs, secret-named keys)."""

from __future__ import annotations

import re

SECRET_WORDS = re.compile(r"token|passw|secret|credential|api_?key|private", re.IGNORECASE)
URL_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,15}://)[^/@\s]*@")
MAX_SHOWN = 60  # characters of a value shown in a message


def mask_secrets(text: str) -> str:
    """Credentials inside URLs -> '***': 'https://u:p@host/x' -> 'https://***@host/x'."""
    return URL_USERINFO_RE.sub(lambda m: f"{m['scheme']}***@", text)


def is_secret_name(name: object) -> bool:
    return isinstance(name, str) and bool(SECRET_WORDS.search(name))


def show(value: object, limit: int = MAX_SHOWN) -> str:
    """A bounded, secret-free repr of ``value`` for messages."""
    if isinstance(value, str):
        text = mask_secrets(value)
        if len(text) <= limit:
            return repr(text)
        return f"{text[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, dict):
        items = list(value.items())
        parts = [
            f"{show(k, 30)}: {'***' if is_secret_name(k) else show(v, 30)}" for k, v in items[:4]
        ]
        more = f", ... ({len(items)} items)" if len(items) > 4 else ""
        return "{" + ", ".join(parts) + more + "}"
    if isinstance(value, list | tuple):
        parts = [show(v, 30) for v in value[:4]]
        more = f", ... ({len(value)} items)" if len(value) > 4 else ""
        text = ", ".join(parts) + more
        return f"[{text}]" if isinstance(value, list) else f"({text})"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"
