"""Why a stream would not open: one plain request to the server, after FFmpeg gave up.

OpenCV's `VideoCapture` says only that an open failed, never why. When a network stream fails
to open, `why_not_open` asks the server once itself: the name lookup, the TCP connection
(refused, timed out, unreachable) and, for HTTP(S) and RTSP, the status of a request for the
same path with the URL's credentials (HTTP 404 Not Found, RTSP 401 Unauthorized). The answer
is a short phrase built from status codes and fixed words: the URL, and so its password, is
never part of it, and a server's reason phrase is cut to printable ASCII.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
import socket
import ssl
from http import HTTPStatus
from urllib.parse import SplitResult, unquote, urlsplit

_PORTS = {"http": 80, "https": 443, "rtsp": 554, "rtsps": 322, "rtmp": 1935}
_REASON_RE = re.compile(r"[^ -~]")
_STATUS_RE = re.compile(r"^RTSP/\d\.\d (\d{3}) ?(.*)$")
_AUTH_RE = re.compile(r'(\w+)="?([^",]*)"?')


def why_not_open(url: str, *, timeout_s: float = 3.0) -> str:
    """A short reason why `url` did not open, found out with one request (see the module
    docstring); "" when there is nothing to ask (a device, a file, UDP)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = _port(parts)
    if scheme not in _PORTS or not parts.hostname or port is None:
        return ""
    try:
        sock = socket.create_connection((parts.hostname, port), timeout=timeout_s)
    except socket.gaierror:
        return f"host {_clean(parts.hostname)} not found"
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"connection timed out after {timeout_s:g} s"
    except OSError as exc:
        return _clean(exc.strerror or type(exc).__name__).lower()
    try:
        if scheme in ("http", "https"):
            return _http(sock, parts, scheme == "https")
        if scheme == "rtsp":
            return _rtsp(sock, parts)
        return "connected, but no stream opened"
    except TimeoutError:
        return f"the server did not answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return f"the server's answer was not {scheme.upper()} ({type(exc).__name__})"
    finally:
        sock.close()


def _port(parts: SplitResult) -> int | None:
    try:
        return parts.port or _PORTS.get(parts.scheme.lower())
    except ValueError:  # a port that is not a number
        return None


def _clean(text: str, limit: int = 60) -> str:
    return _REASON_RE.sub("", text).strip()[:limit]


def _target(parts: SplitResult) -> str:
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def camera_tls() -> ssl.SSLContext:
    """TLS as FFmpeg does it by default: certificates not verified (cameras carry
    self-signed ones), for our own readers and for the diagnosis alike."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def basic_auth(parts: SplitResult) -> str | None:
    """The Basic `Authorization` header for a URL's credentials (None without any)."""
    creds = _credentials(parts)
    return _basic(*creds) if creds is not None else None


def http_phrase(status: int, given: str = "") -> str:
    """The standard reason phrase of an HTTP status (a server's own text may be anything;
    it is used, cleaned, only for a status the standard does not name)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return _clean(given) or "unknown status"


def _credentials(parts: SplitResult) -> tuple[str, str] | None:
    if parts.username is None:
        return None
    return unquote(parts.username), unquote(parts.password or "")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _http(sock: socket.socket, parts: SplitResult, tls: bool) -> str:
    host = parts.hostname or ""
    if tls:
        sock = camera_tls().wrap_socket(sock, server_hostname=host)
    conn = http.client.HTTPConnection(host, parts.port)
    conn.sock = sock
    headers = {"User-Agent": "drivepercept-probe"}
    creds = _credentials(parts)
    if (auth := basic_auth(parts)) is not None:
        headers["Authorization"] = auth
    conn.request("GET", _target(parts), headers=headers)
    response = conn.getresponse()
    status = response.status
    reason = http_phrase(status, response.reason)
    if status < 300:
        kind = _clean(response.getheader("Content-Type") or "no content type")
        return f"HTTP {status}, but the content ({kind}) is not a video stream FFmpeg reads"
    if status in (401, 403):
        tried = "the credentials were refused" if creds else "no credentials in the URL"
        return f"HTTP {status} {reason or 'Unauthorized'}: {tried}"
    return f"HTTP {status} {reason}".strip()


def _rtsp(sock: socket.socket, parts: SplitResult) -> str:
    url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # no credentials
    creds = _credentials(parts)
    status, reason, challenge = _rtsp_describe(sock, url, 1, "")
    if status == 401 and creds is not None:
        auth = _rtsp_auth(challenge, url, *creds)
        if auth:
            status, reason, _ = _rtsp_describe(sock, url, 2, auth)
    if status == 200:
        return "RTSP 200, but the stream did not open (codec or transport)"
    if status == 401:
        tried = "the credentials were refused" if creds else "no credentials in the URL"
        return f"RTSP 401 Unauthorized: {tried}"
    return f"RTSP {status} {reason}".strip()


def _rtsp_describe(sock: socket.socket, url: str, seq: int, auth: str) -> tuple[int, str, str]:
    lines = [f"DESCRIBE {url} RTSP/1.0", f"CSeq: {seq}", "Accept: application/sdp"]
    if auth:
        lines.append(f"Authorization: {auth}")
    sock.sendall(("\r\n".join([*lines, "User-Agent: drivepercept-probe", "", ""])).encode())
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 16384:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    text = head.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    first, *fields = text.split("\r\n")
    match = _STATUS_RE.match(first)
    if match is None:
        raise ValueError("not an RTSP status line")
    challenge = next(
        (f.split(":", 1)[1].strip() for f in fields if f.lower().startswith("www-authenticate:")),
        "",
    )
    return int(match.group(1)), _clean(match.group(2)), challenge


def _rtsp_auth(challenge: str, url: str, user: str, password: str) -> str:
    """The Authorization header answering a WWW-Authenticate challenge (Basic, or Digest
    as RFC 2069/2617 without qop, which is what RTSP cameras send)."""
    scheme = challenge.split(" ", 1)[0].lower()
    if scheme == "basic":
        return _basic(user, password)
    if scheme != "digest":
        return ""
    fields = dict(_AUTH_RE.findall(challenge))
    realm, nonce = fields.get("realm", ""), fields.get("nonce", "")

    def md5(text: str) -> str:
        return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()

    response = md5(f"{md5(f'{user}:{realm}:{password}')}:{nonce}:{md5(f'DESCRIBE:{url}')}")
    return (
        f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{url}", '
        f'response="{response}"'
    )
