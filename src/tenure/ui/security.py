"""Who may use the dashboard, and proof that a POST came from one of its own pages.

* Credential: when one is configured, every request needs it, as HTTP Basic auth (any user
  name, the credential as password: browsers ask for it) or ``Authorization: Bearer``.
  Actions (pause, resume, trigger, release, retry, purge) exist only when the dashboard was
  started with actions enabled *and* a credential.
* CSRF: a browser sends Basic credentials with any request to the origin, also one forged by
  another site, so every POST must also carry a token that only the dashboard's own pages
  know: an HMAC (with a per-process secret) of a random per-browser cookie, in the form field
  ``csrf``. A POST whose ``Origin`` header names another origin is refused as well.
* Notices: the message an action leaves in its redirect (``?notice=...&sig=...``) is shown
  only when its signature is the same process's HMAC of it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping

COOKIE = "tenure_ui_session"
FIELD = "csrf"


def credential_ok(expected: str | None, authorization: str | None) -> bool:
    if expected is None:
        return True
    if not authorization:
        return False
    scheme, _, value = authorization.partition(" ")
    scheme = scheme.lower()
    given: str | None = None
    if scheme == "bearer":
        given = value.strip()
    elif scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        given = decoded.partition(":")[2]
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class Csrf:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def token_for(self, session: str) -> str:
        return hmac.new(self._secret, session.encode("utf-8"), hashlib.sha256).hexdigest()

    def check(self, session: str | None, token: str | None) -> bool:
        if not session or not token:
            return False
        return hmac.compare_digest(self.token_for(session), token)

    def sign(self, notice: str) -> str:
        """A signature for a notice this dashboard puts in a redirect's address: a page
        shows a notice only with it, so a link made elsewhere cannot put words in the
        dashboard's success banner."""
        mac = hmac.new(self._secret, b"notice\0" + notice.encode("utf-8"), hashlib.sha256)
        return mac.hexdigest()

    def signed(self, notice: str | None, signature: str | None) -> str | None:
        """``notice`` when ``signature`` is this process's :meth:`sign` of it, else None."""
        if not notice or not signature:
            return None
        return notice if hmac.compare_digest(self.sign(notice), signature) else None


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """False when the request says it came from another origin (Origin header)."""
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = headers.get("host", "")
    return origin in (f"{scheme}://{host}", f"http://{host}", f"https://{host}")
