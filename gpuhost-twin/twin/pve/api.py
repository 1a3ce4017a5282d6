"""The twin's Proxmox API: https://<address>:8006/api2/json, API-token auth, over /etc/pve.

    python -m twin.pve.api --root <twin root> --address 127.0.0.N [--port 8006]

Serves the routes of twin/pve/routes.py with pveproxy's conventions (docs/reference/formats.md §4): responses
wrapped as {"data": ...}; errors as HTTP status + reason (the message's first line) and
{"data": null, "message": ...} plus {"errors": {...}} for parameter errors.
Auth: `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`, checked like
AccessControl::verify_token against /etc/pve/user.cfg (the user exists and is enabled, neither
user nor token expired) and /etc/pve/priv/token.cfg (`user@realm!tokenid <secret>` lines, as
pmxcfs keeps them). No header: 401 "No ticket"; anything wrong: 401 "Authentication failed!";
both with an empty body after 3 s. The caller is the token id (access.py decides what it may
do); tasks run in worker threads of this server (tasks.py).
TLS: a self-signed certificate per twin in <root>/etc/pve/local/pve-ssl.{pem,key}, also copied to
<root>/etc/pve/pve-root-ca.pem so clients can verify against it. Secrets are never logged.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from . import access, routes
from . import config as cfg
from .schema import ParamError, PveError

PREFIX = "/api2/json"
TOKEN_FILE = "etc/pve/priv/token.cfg"


# --- tokens and certificates ---


def create_token(
    root: Path, userid: str = "root@pam", tokenid: str = "gpuhost", privsep: bool = True
) -> str:
    """`pveum user token add USERID TOKENID --privsep 0|1`: token.cfg + user.cfg; the secret.

    A privsep token (the default, as in Proxmox) has only what access.grant() gives it."""
    return access.add_token(root, userid, tokenid, privsep=privsep)


def load_tokens(path: Path) -> dict[str, str]:
    """{"user@realm!tokenid": secret} from a token.cfg; `=` is accepted as separator too."""
    try:
        return access.parse_secrets(path.read_text())
    except FileNotFoundError:
        return {}


def ensure_certificate(root: Path, address: str) -> tuple[Path, Path]:
    """Self-signed pve-ssl.pem/key for the node name and address (made once per twin)."""
    local = root / "etc/pve/local"
    local = local if local.exists() else root / "etc/pve/nodes" / cfg.node_name(root)
    local.mkdir(parents=True, exist_ok=True)
    pem, key = local / "pve-ssl.pem", local / "pve-ssl.key"
    marker = local / ".pve-ssl.san"
    node = cfg.node_name(root)
    san = f"DNS:{node},DNS:localhost,IP:127.0.0.1"
    if address and _is_ip(address) and address != "127.0.0.1":
        san += f",IP:{address}"
    if not (pem.exists() and key.exists() and marker.exists() and marker.read_text() == san):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "3650",
             "-keyout", str(key), "-out", str(pem), "-subj", f"/OU=PVE Cluster Node/O=Proxmox Virtual Environment/CN={node}",
             "-addext", f"subjectAltName={san}",
             "-addext", "basicConstraints=critical,CA:TRUE"],
            check=True, capture_output=True,
        )  # fmt: skip
        key.chmod(0o600)
        marker.write_text(san)
    (root / "etc/pve/pve-root-ca.pem").write_bytes(pem.read_bytes())
    return pem, key


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# --- the server ---


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    # pve-http-server delays every unauthorized answer by 3 s (AnyEvent.pm: "always delay
    # unauthorized calls by 3 seconds"); TWIN_API_AUTH_DELAY changes it for the twin
    auth_delay = float(os.environ.get("TWIN_API_AUTH_DELAY", "3"))

    def __init__(self, root: Path, address: str, port: int) -> None:
        self.root = root
        super().__init__((address, port), ApiHandler)


class ApiHandler(BaseHTTPRequestHandler):
    server: ApiServer
    server_version = "pve-api-daemon/3.0"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: request lines may carry parameters; never log anything secret."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _caller(self) -> str:
        """HTTPServer.pm auth_handler: the token id, or PveError 401 (reason as Proxmox gives)."""
        header = self.headers.get("Authorization")
        m = re.fullmatch(r"PVEAPIToken=(\S+?![^=\s]+)=(\S+)", (header or "").strip())
        if header is None or not m:
            raise PveError("No ticket", code=401)
        try:
            return access.verify_token(self.server.root, m.group(1), m.group(2))
        except PveError:
            raise PveError("Authentication failed!", code=401) from None

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if not url.path.startswith(PREFIX + "/") and url.path != PREFIX:
            self._reply(404, "Not Found", None)
            return
        try:
            user = self._caller()
        except PveError as exc:
            time.sleep(self.server.auth_delay)
            self._reply(401, exc.msg.strip(), None, raw=b"")
            return
        pairs = parse_qsl(url.query, keep_blank_values=True)
        if body:
            if "json" in (self.headers.get("Content-Type") or ""):
                pairs += [(k, _text(v)) for k, v in json.loads(body).items()]
            else:
                pairs += parse_qsl(body, keep_blank_values=True)
        params: dict[str, str | list[str]] = {}
        for key, value in pairs:  # a repeated key becomes an array (HTTPServer, CGI-style)
            old = params.get(key)
            params[key] = value if old is None else [*([old] if isinstance(old, str) else old),
                                                     value]  # fmt: skip
        path = url.path[len(PREFIX) :] or "/"
        cfg.drain_warnings()  # pveproxy sends parser warnings to syslog, not to the client
        try:
            result = routes.call(self.server.root, method, path, params, user, background=True)
        except ParamError as exc:
            self._reply(400, exc.msg.strip(), None, errors=exc.errors, message=exc.text())
            return
        except PveError as exc:
            self._reply(exc.code, exc.msg.strip().splitlines()[0], None, message=exc.msg)
            return
        except Exception as exc:  # a twin bug: answer like a crashed handler, keep serving
            # and say where, in the twin's log (the supervisor's stderr): no parameters, which
            # may carry secrets, only the route and the traceback
            print(f"api: {method} {path}: twin bug\n{traceback.format_exc()}", file=sys.stderr)
            self._reply(500, f"internal error: {type(exc).__name__}", None)
            return
        self._reply(200, "OK", result.data)

    def _reply(
        self,
        code: int,
        reason: str,
        data: object,
        errors: dict[str, str] | None = None,
        message: str | None = None,
        raw: bytes | None = None,
    ) -> None:
        """pveproxy's JSON formatter: {"data": ...}, plus "errors" and "message" on failures."""
        payload: dict[str, object] = {"data": data}
        if errors:
            payload["errors"] = errors
        if message is not None:
            payload["message"] = message
        body = json.dumps(payload).encode() if raw is None else raw
        self.send_response(code, reason.encode("latin-1", "replace").decode("latin-1"))
        if raw is None:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=0")
        self.end_headers()
        self.wfile.write(body)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def serve(root: Path, address: str = "127.0.0.1", port: int = 8006) -> ApiServer:
    """A ready (not yet serving) HTTPS server; call serve_forever() or run it in a thread."""
    pem, key = ensure_certificate(root, address)
    server = ApiServer(root, address, port)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def serve_in_thread(
    root: Path, address: str = "127.0.0.1", port: int = 8006
) -> tuple[ApiServer, threading.Thread]:
    server = serve(root, address, port)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return server, thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m twin.pve.api", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--root", type=Path, required=True, help="the twin's root directory")
    parser.add_argument("--address", default="127.0.0.1", help="loopback address to listen on")
    parser.add_argument("--port", type=int, default=8006)
    args = parser.parse_args(argv)
    server = serve(args.root, args.address, args.port)
    print(
        f"twin Proxmox API on https://{args.address}:{args.port}{PREFIX}",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
