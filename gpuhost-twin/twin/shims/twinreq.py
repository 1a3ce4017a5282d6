"""Client side of the twin's request protocol; installed as /usr/lib/gpuhost-twin/twinreq.py.

Stdlib only: shims inside the twin (reboot, systemctl, pct, ...) import it with
    sys.path.insert(0, "/usr/lib/gpuhost-twin"); import twinreq
and call ``twinreq.request({"op": "ct-start", "ctid": 101})``. The supervisor outside the chroot
picks up /run/gpuhost-twin/requests/<id>.json and answers in <id>.done with
{"rc": int, "stdout": str, "stderr": str}. See twin/README.md for the ops.
"""

from __future__ import annotations

import json
import os
import time
import uuid

REQUESTS = "/run/gpuhost-twin/requests"


def submit(req: dict) -> str:
    """Drop a request and return its id without waiting (reboot: the answer may never be read)."""
    os.makedirs(REQUESTS, exist_ok=True)
    rid = uuid.uuid4().hex
    tmp = os.path.join(REQUESTS, f".{rid}.tmp")
    with open(tmp, "w") as f:
        json.dump(req, f)
    os.rename(tmp, os.path.join(REQUESTS, f"{rid}.json"))  # atomic: never half a request
    return rid


def wait(rid: str, timeout: float = 120.0) -> dict:
    done = os.path.join(REQUESTS, f"{rid}.done")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(done) as f:
                answer = json.load(f)
        except FileNotFoundError:
            time.sleep(0.02)
            continue
        os.unlink(done)
        return answer
    return {
        "rc": 124,
        "stdout": "",
        "stderr": f"twin supervisor did not answer within {timeout} s\n",
    }


def request(req: dict, timeout: float = 120.0) -> dict:
    return wait(submit(req), timeout)


def relay(answer: dict) -> int:
    """Print an answer as the tool would and return its exit status (for shims' main())."""
    import sys

    sys.stdout.write(answer.get("stdout", ""))
    sys.stderr.write(answer.get("stderr", ""))
    return int(answer.get("rc", 1))


if __name__ == "__main__":
    # python3 /usr/lib/gpuhost-twin/twinreq.py '{"op": "ct-start", "ctid": 101}'
    import sys

    sys.exit(relay(request(json.loads(sys.argv[1]))))
