"""Real ``permitd`` processes for the Python tests, like the TypeScript ``harness.ts``
and the Rust ``tests/src/lib.rs``: a ``cluster.toml`` with free loopback ports,
short Raft timings and small round timings in a temporary directory, one
``permitd serve --config ... --id N`` per node, ``POST /cluster/init``, and every
process killed at ``stop()``.

The binary: ``PERMITD_BIN``, else ``$CARGO_TARGET_DIR/debug/permitd``, else the
repository's ``target/debug/permitd`` (``cargo build -p permitd`` makes it).
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Optional

SECRET = "permitd-test-secret-0123456789"
#: The admin token every test cluster uses (auth is on, as in production).
ADMIN_TOKEN = "permitd-test-admin-token-0123456789"
START_TIMEOUT_S = 30.0
POLL_S = 0.05
REPOSITORY = Path(__file__).resolve().parents[3]
DEFAULTS = "limit = 100\nroundWaitMs = 20\nroundPeriodMs = 20\ngrantTimeoutMs = 60000\n"


def permitd_bin() -> str:
    candidates = [
        os.environ.get("PERMITD_BIN"),
        os.environ.get("CARGO_TARGET_DIR") and os.path.join(os.environ["CARGO_TARGET_DIR"], "debug", "permitd"),
        str(REPOSITORY / "target" / "debug" / "permitd"),
    ]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError(f"no permitd binary in {candidates}: run cargo build -p permitd or set PERMITD_BIN")


_handed_out: set[int] = set()


def free_port() -> int:
    """A free loopback port below the ephemeral range (see ``free_port`` in the Rust harness)."""
    while True:
        port = 20_000 + random.randrange(12_000)
        if port in _handed_out:
            continue
        _handed_out.add(port)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def eventually(timeout_s: float, check: Callable[[], bool], what: str) -> None:
    """Polls ``check`` until it holds; raises after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


_trusted: Optional[ssl.SSLContext] = None


def healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/healthz", timeout=1, context=_trusted) as answer:
        return bool(answer.status == 200)


def make_certificates(directory: str) -> str:
    """A CA and one certificate for 127.0.0.1 (every node's), by ``openssl``; the ``[tls]`` table.
    The harness's own HTTP calls trust the CA from then on."""
    global _trusted
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    extensions = os.path.join(directory, "node.ext")
    Path(extensions).write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n")
    signed = ["-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial", "-out", "node.pem", "-days", "2", "-extfile", "node.ext"]
    for command in (
        ["req", "-x509", *ec, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2", "-subj", "/CN=permitd-test-ca"],
        ["req", *ec, "-keyout", "node-key.pem", "-out", "node.csr", "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", "node.csr", *signed],
    ):
        subprocess.run(["openssl", *command], cwd=directory, check=True, capture_output=True)
    _trusted = ssl.create_default_context(cafile=os.path.join(directory, "ca.pem"))
    return '[tls]\ncert_file = "node.pem"\nkey_file = "node-key.pem"\nca_file = "ca.pem"\n\n'


def http_json(url: str, method: str = "GET", body: Optional[object] = None, timeout: float = 2.0) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout, context=_trusted) as answer:
        return json.loads(answer.read() or b"null")


def metric_total(url: str, name: str, timeout: float = 2.0) -> float:
    """The sum of every sample of metric ``name`` in a node's ``/metrics``."""
    request = urllib.request.Request(f"{url}/metrics", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=timeout, context=_trusted) as answer:
        lines = answer.read().decode().splitlines()
    samples = [line.rsplit(" ", 1)[1] for line in lines if line.startswith(name) and not line.startswith("#")]
    return sum(float(value) for value in samples)


class Node:
    def __init__(self, node_id: int, url: str) -> None:
        self.id = node_id
        self.url = url
        self.process: Optional[subprocess.Popen[bytes]] = None


class Cluster:
    def __init__(self, directory: str, nodes: List[Node], config: str) -> None:
        self.ca_file: Optional[str] = None
        self.dir = directory
        self.nodes = nodes
        self.config = config

    @classmethod
    def start(cls, nodes: int = 3, defaults: str = DEFAULTS, tls: bool = False, shards: Optional[int] = None) -> Cluster:
        """``tls``: both listeners on HTTPS with a fresh CA (``self.ca_file``; needs ``openssl``).
        ``shards``: ``[cluster] shards``, the number of Raft groups (the node's default, 1, when unset)."""
        directory = tempfile.mkdtemp(prefix="permitd-py-")
        scheme = "https" if tls else "http"
        tls_table = make_certificates(directory) if tls else ""
        text = (
            f'secret = "{SECRET}"\n\n[auth]\nadmin_token = "{ADMIN_TOKEN}"\n\n[raft]\nheartbeat_interval_ms = 50\n'
            "election_timeout_min_ms = 300\nelection_timeout_max_ms = 600\nrpc_timeout_ms = 500\nsnapshot_every_logs = 500\n\n"
            f"[defaults]\n{defaults}\n{tls_table}"
        )
        if shards is not None:
            text += f"[cluster]\nshards = {shards}\n\n"
        members = []
        for node_id in range(1, nodes + 1):
            api, raft = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            text += f'[[node]]\nid = {node_id}\napi_addr = "{api}"\nraft_addr = "{raft}"\ndata_dir = "data/node-{node_id}"\n\n'
            members.append(Node(node_id, f"{scheme}://{api}"))
        config = os.path.join(directory, "cluster.toml")
        Path(config).write_text(text)
        cluster = cls(directory, members, config)
        cluster.ca_file = os.path.join(directory, "ca.pem") if tls else None
        try:
            for node in members:
                cluster.spawn(node)
            for node in members:
                eventually(START_TIMEOUT_S, functools.partial(healthy, node.url), f"node {node.id} healthy")
            http_json(f"{members[0].url}/cluster/init", "POST", {}, timeout=START_TIMEOUT_S)
            cluster.wait_for_leader()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def urls(self) -> List[str]:
        return [node.url for node in self.nodes]

    def spawn(self, node: Node) -> None:
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info,openraft=warn")}
        # The child keeps its own copy of the log's descriptor.
        with open(os.path.join(self.dir, f"node-{node.id}.log"), "ab") as log:
            node.process = subprocess.Popen(
                [permitd_bin(), "serve", "--config", self.config, "--id", str(node.id)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def status(self, node: Node) -> Optional[Dict[str, object]]:
        try:
            answer = http_json(f"{node.url}/cluster/status")
        except Exception:
            return None
        return answer if isinstance(answer, dict) else None

    def wait_for_leader(self) -> int:
        """Waits until every running node names the same running leader, and returns it."""
        found: List[int] = []

        def agreed() -> bool:
            running = [node for node in self.nodes if node.process is not None]
            seen = [(self.status(node) or {}).get("leader") for node in running]
            first = seen[0]
            if isinstance(first, int) and all(leader == first for leader in seen) and any(node.id == first for node in running):
                found[:] = [first]
                return True
            return False

        eventually(START_TIMEOUT_S, agreed, "a leader agreed")
        return found[0]

    def kill(self, node_id: int) -> None:
        """SIGKILLs node ``node_id`` and waits for it to be gone."""
        node = next(node for node in self.nodes if node.id == node_id)
        process, node.process = node.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def node(self, node_id: int) -> Node:
        return next(node for node in self.nodes if node.id == node_id)

    def stop(self) -> None:
        for node in self.nodes:
            self.kill(node.id)
        if not os.environ.get("PERMITD_KEEP_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)
