"""The network boundary end to end: `gatekeeper run` in an isolated pair of namespaces.

The test thread enters the isolated `outer` namespace (no route off this machine), so the
launcher started from it, its proxy and the sandbox all live there; the test hosts live in
`remote`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from net_ns import REMOTE_V4, IsolatedNet
from net_sandbox import needs_netns
from net_servers import RecordingHTTPServer

from conftest import gk, make_repo
from helpers import run_json

pytest_plugins = ["net_fixtures"]
pytestmark = [needs_netns, pytest.mark.sandbox]

FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        print('FETCH', url, urllib.request.urlopen(url, timeout=10).read().decode())\n"
    "    except urllib.error.HTTPError as e:\n"
    "        print('FETCH', url, e.code, e.headers.get('X-Gatekeeper-Reason'))\n"
)
DIRECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)\n"
    "    print('DIRECT connected')\n"
    "except OSError as e:\n"
    "    print('DIRECT', e.errno)\n"
)


@pytest.fixture
def remote_http(outer: IsolatedNet) -> Iterator[RecordingHTTPServer]:
    with outer.inside("remote"):
        server = RecordingHTTPServer((REMOTE_V4, 0), files={"/pkg": b"package-bytes"}).start()
    yield server
    server.close()


@pytest.fixture
def local_http(outer: IsolatedNet) -> Iterator[RecordingHTTPServer]:
    server = RecordingHTTPServer(("127.0.0.1", 0), files={"/svc": b"loopback-service"}).start()
    yield server
    server.close()


def receipt(repo: Path, commit: str) -> dict:  # type: ignore[type-arg]
    proc = gk("receipt", "show", "--repo", str(repo), "--json", commit)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)[0]["statement"]["predicate"]


def test_granted_host_is_reachable_others_refused_and_everything_recorded(
    tmp_path: Path, key: Path, outer: IsolatedNet, remote_http: RecordingHTTPServer
) -> None:
    policy = "network: {arbitrary_web: ask, internal_services: deny, localhost: deny}\n"
    repo = make_repo(tmp_path / "r", policy=policy, files={"fetch.py": FETCH, "direct.py": DIRECT})
    granted = f"http://{REMOTE_V4}:{remote_http.port}/pkg"
    script = (
        f"curl -sS {granted}; echo; python3 fetch.py {granted} http://{REMOTE_V4}:1/x "
        f"http://10.1.2.3/meta; python3 direct.py {REMOTE_V4} {remote_http.port}; "
        "python3 -c 'import socket; socket.getaddrinfo(\"pkgs.test\", 443)' 2>&1 | tail -1; exit 0"
    )
    outer.assert_inside()
    proc, data = run_json(
        repo, "sh", "-c", script, extra=["--grant", f"network={REMOTE_V4}:{remote_http.port}"]
    )
    out = proc.stderr
    assert proc.returncode == 0, out
    assert "package-bytes" in out.splitlines()[0]  # curl, through HTTP_PROXY
    assert f"FETCH {granted} package-bytes" in out  # urllib (pip-style), through the proxy
    assert f"FETCH http://{REMOTE_V4}:1/x 403" in out  # ask without a terminal: refused
    assert "FETCH http://10.1.2.3/meta 403" in out  # internal address: refused
    assert "DIRECT 101" in out  # no route but the proxy (ENETUNREACH)
    assert "Temporary failure in name resolution" in out or "Name or service" in out
    assert len(remote_http.requests) == 2  # only the granted fetches reached the host
    pred = receipt(repo, data["commit"])
    network = pred["network"]
    allowed = [n for n in network if n["decision"] == "allow"]
    assert len(allowed) == 2 and all(n["host"] == REMOTE_V4 for n in allowed)
    assert all(n["bytes_down"] and n["method"] == "GET" for n in allowed)
    assert any(n["port"] == 1 and n["decision"] != "allow" for n in network)
    assert any(n["host"] == "10.1.2.3" and n["category"] == "internal_services" for n in network)
    assert any(n["category"] == "direct" and n["host"] == REMOTE_V4 for n in network)
    assert pred["counts"]["network_requests"] == sum(n.get("count") or 1 for n in network)
    kinds = {(e["kind"], e["decision"]) for e in pred["escalations"]}
    assert ("network", "granted") in kinds and ("network", "pending") in kinds
    assert pred["sandbox"]["network"] == "proxy"
    assert "denied    network" in gk("run", "--repo", str(repo), "--", "sh", "-c",
                                     f"curl -s http://{REMOTE_V4}:1/ ; exit 0").stderr  # fmt: skip


@pytest.mark.parametrize("allowed", [True, False])
def test_host_loopback_service_only_when_its_port_is_allowed(
    tmp_path: Path, key: Path, outer: IsolatedNet, local_http: RecordingHTTPServer, allowed: bool
) -> None:
    port = local_http.port
    policy = f"network: {{localhost: [{port}]}}\n" if allowed else "network: {localhost: deny}\n"
    repo = make_repo(tmp_path / "r", policy=policy)
    outer.assert_inside()
    proc, data = run_json(repo, "sh", "-c",
                          f"curl -sS --noproxy '*' http://127.0.0.1:{port}/svc; exit 0")  # fmt: skip
    assert ("loopback-service" in proc.stderr) is allowed, proc.stderr
    assert (len(local_http.requests) == 1) is allowed
