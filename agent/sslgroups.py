"""The key-exchange groups (curves) a TLS context offers, in the server's order of preference.

Python's ssl module sets one ECDH curve at most (`SSLContext.set_ecdh_curve`, and not X25519),
while the exporter-toolkit's `curve_preferences` is a list. OpenSSL's own call,
`SSL_CTX_set1_groups_list`, is a macro over `SSL_CTX_ctrl`, which the `_ssl` extension's libssl
exports; the context's `SSL_CTX *` is the first field of CPython's `PySSLContext` after the
object header (3.10 to 3.14). That pointer is checked before use: OpenSSL must report the
context's own options for it, or nothing is called.
"""

from __future__ import annotations

import ctypes
import ssl
from collections.abc import Sequence

_SSL_CTRL_SET_GROUPS_LIST = 92  # openssl/ssl.h, OpenSSL 1.1.1 and 3.x


def _libssl() -> ctypes.CDLL:
    import _ssl

    # dlopen of the already loaded extension: its symbol lookup reaches the libssl it links.
    library = ctypes.CDLL(getattr(_ssl, "__file__", None))
    library.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_char_p]
    library.SSL_CTX_ctrl.restype = ctypes.c_long
    library.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
    library.SSL_CTX_get_options.restype = ctypes.c_uint64
    return library


def set_groups(context: ssl.SSLContext, groups: Sequence[str]) -> None:
    """Offer exactly `groups` (OpenSSL names: X25519, P-256, ...), in this order of preference.

    Raises ValueError when OpenSSL refuses a name, OSError when this Python's ssl module cannot
    be reached this way."""
    try:
        library = _libssl()
    except (OSError, AttributeError) as err:
        raise OSError(f"libssl's SSL_CTX_ctrl is not reachable from Python's ssl module: {err}") from err
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not pointer or library.SSL_CTX_get_options(pointer) != int(context.options):
        raise OSError("this Python's SSLContext does not hold its SSL_CTX where CPython 3.10-3.14 does")
    if library.SSL_CTX_ctrl(pointer, _SSL_CTRL_SET_GROUPS_LIST, 0, ":".join(groups).encode()) != 1:
        raise ValueError(f"OpenSSL {ssl.OPENSSL_VERSION} refuses the groups {':'.join(groups)}")
