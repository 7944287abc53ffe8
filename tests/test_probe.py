"""Why a stream would not open: refused, silent, HTTP and RTSP statuses, and Digest
credentials, against small local servers; the reason never carries the password."""

from __future__ import annotations

import hashlib
import re
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drivepercept.sources.probe import why_not_open

pytestmark = pytest.mark.timeout(30)

SECRET = "S3cretPass"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/private.mjpg":
            if self.headers.get("Authorization") is None:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="cam"')
                self.end_headers()
                return
            self.send_error(403, "go away <script>")
            return
        if path == "/page.html":
            body = b"<html>not a stream</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_error(404, "no such stream, and a long custom reason phrase")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, name="test-http", daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _serve(answer: Callable[[bytes], bytes | None]) -> tuple[int, socket.socket]:
    """A TCP server thread that answers each request head with `answer(head)`; None: say
    nothing and keep the connection open."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                    if not head:
                        break
                    reply = answer(head)
                    if reply is None:
                        conn.recv(1)  # until the client gives up
                        break
                    conn.sendall(reply)

    threading.Thread(target=loop, name="test-tcp", daemon=True).start()
    return int(listener.getsockname()[1]), listener


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def _rtsp_camera(head: bytes) -> bytes:
    """An RTSP camera with Digest authentication (user admin, password SECRET) and one
    stream, /live; it checks the Digest response as a real camera does."""
    text = head.decode()
    seq = re.search(r"CSeq: (\d+)", text)
    cseq = seq.group(1) if seq else "0"
    url = text.split(" ")[1]
    if not url.endswith("/live"):
        return f"RTSP/1.0 404 Not Found\r\nCSeq: {cseq}\r\n\r\n".encode()
    auth = re.search(r'Authorization: Digest .*response="([0-9a-f]+)"', text)
    want = _md5(f"{_md5(f'admin:cam:{SECRET}')}:n0nce:{_md5(f'DESCRIBE:{url}')}")
    if auth and auth.group(1) == want:
        return f"RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nContent-Length: 0\r\n\r\n".encode()
    challenge = 'WWW-Authenticate: Digest realm="cam", nonce="n0nce"'
    return f"RTSP/1.0 401 Unauthorized\r\nCSeq: {cseq}\r\n{challenge}\r\n\r\n".encode()


def test_nothing_listening_is_connection_refused() -> None:
    assert why_not_open(f"rtsp://admin:{SECRET}@127.0.0.1:{_free_port()}/x") == (
        "connection refused"
    )


@pytest.mark.parametrize(
    ("path", "creds", "reason"),
    [
        ("/absent.mjpg", "", "HTTP 404 Not Found"),
        ("/private.mjpg", "", "HTTP 401 Unauthorized: no credentials in the URL"),
        ("/private.mjpg", f"admin:{SECRET}@", "HTTP 403 Forbidden: the credentials were refused"),
        ("/page.html", "", "HTTP 200, but the content (text/html) is not a video stream"),
    ],
)
def test_http_status_is_the_reason(http_port: int, path: str, creds: str, reason: str) -> None:
    got = why_not_open(f"http://{creds}127.0.0.1:{http_port}{path}?token={SECRET}")
    assert got.startswith(reason), got
    assert SECRET not in got and "<" not in got


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("rtsp://{host}/other", "RTSP 404 Not Found"),
        ("rtsp://{host}/live", "RTSP 401 Unauthorized: no credentials in the URL"),
        ("rtsp://admin:wrong@{host}/live", "RTSP 401 Unauthorized: the credentials were refused"),
        # right credentials (Digest computed correctly), yet FFmpeg failed: not an auth problem
        (f"rtsp://admin:{SECRET}@{{host}}/live", "RTSP 200, but the stream did not open"),
    ],
)
def test_rtsp_status_with_digest_credentials(url: str, reason: str) -> None:
    port, listener = _serve(_rtsp_camera)
    try:
        got = why_not_open(url.format(host=f"127.0.0.1:{port}"))
    finally:
        listener.close()
    assert got.startswith(reason), got
    assert SECRET not in got


def test_a_server_that_never_answers_times_out() -> None:
    port, listener = _serve(lambda head: None)
    try:
        got = why_not_open(f"http://127.0.0.1:{port}/cam.mjpg", timeout_s=0.5)
    finally:
        listener.close()
    assert got == "the server did not answer within 0.5 s"


def test_a_server_speaking_something_else() -> None:
    port, listener = _serve(lambda head: b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    try:
        got = why_not_open(f"rtsp://127.0.0.1:{port}/live")
    finally:
        listener.close()
    assert got == "the server's answer was not RTSP (ValueError)"


@pytest.mark.parametrize("source", ["0", "/dev/video9", "clip.mp4", "udp://@:5000"])
def test_nothing_to_ask_for_devices_files_and_udp(source: str) -> None:
    assert why_not_open(source) == ""
