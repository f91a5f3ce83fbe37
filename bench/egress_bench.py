"""The egress proxy against the plain bridge (issue 27's benchmark rows), in one run.

A test server (the sandbox image running `python3 -m http.server`) listens on a Docker network
this script makes. Two sandboxes fetch from it: one through the egress proxy (no network, its
folder, two proxy replicas started here from .venv-egress), one on that network directly (what
`network_egress` gave before). Each row prints both and their ratio:

  download   a 20 MB file, 5 rounds of 5 each (alternating), median   target >= 0.8x the bridge's
  https      the same over HTTPS (a CONNECT tunnel through the proxy)  no target: measured
  setup      50 plain-HTTP GETs, a new connection each, p50   target <= 5 ms over the bridge's
  pip        `pip install` of 20 small wheels from the index  target <= 1.3x the bridge's time
  isolation  another sandbox's GET p50 while one floods 90 connections of 20 MB at once
             (it meets its own cap), against the same alone
  flood      N sandboxes (100) each making M requests (50) at once through the proxy: refusals
             (target none) and the proxies' CPU per request

    .venv/bin/python bench/egress_bench.py [--rows download,https,setup,pip,isolation,flood]
                                           [--flood 100x50]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402
import httpx  # noqa: E402

from services.runtime.containers import DockerSandboxes, Sandbox  # noqa: E402
from services.runtime.sandbox_shape import SandboxShape  # noqa: E402
from services.runtime.settings import RuntimeSettings  # noqa: E402
from shared.egress_policy import EgressPolicy, SandboxEgress  # noqa: E402
from tools.egress_ca import issue, new_ca  # noqa: E402
from tools.procs import free_port  # noqa: E402

IMAGE = os.environ.get("DECKHANDS_SANDBOX_IMAGE", "deckhands/sandbox:latest")
PORT = 8000
WHEELS = 20
DOWNLOAD_ROUNDS = 5

DOWNLOAD = r"""
import sys, time, urllib.request
times = []
for _ in range(5):
    t = time.perf_counter()
    data = urllib.request.urlopen(sys.argv[1], timeout=60).read()
    times.append(time.perf_counter() - t)
    assert len(data) == 20 * 1024 * 1024, len(data)
times.sort()
print("MBPS", 20 / times[2])
"""
# The same over HTTPS: through the proxy a CONNECT tunnel relayed as bytes (what pip, npm and git
# use). The test server's certificate is the benchmark's own, so it is not verified.
DOWNLOAD_TLS = DOWNLOAD.replace(
    "urlopen(sys.argv[1], timeout=60)",
    "urlopen(sys.argv[1], timeout=60, context=ssl._create_unverified_context())",
).replace("import sys,", "import ssl, sys,")
# The test server: `python3 -m http.server`, with the listen backlog a real package index has.
# http.server's is 5: under the flood row, connections past it waited out SYN retransmits
# (1, 3, 7, 15, 31 s) and some requests their client's 60 s, which measured the test server.
SERVER = f"""
import functools, http.server
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/srv")
http.server.ThreadingHTTPServer.request_queue_size = 1024
http.server.ThreadingHTTPServer(("", {PORT}), handler).serve_forever()
"""
TLS_PORT = 8443
TLS_SERVER = f"""
import functools, http.server, ssl
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/tls/cert.pem", "/tls/key.pem")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/srv")
http.server.ThreadingHTTPServer.request_queue_size = 1024
server = http.server.ThreadingHTTPServer(("", {TLS_PORT}), handler)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""
SETUP = r"""
import sys, time, urllib.request
times = []
for _ in range(50):
    t = time.perf_counter()
    urllib.request.urlopen(sys.argv[1], timeout=10).read()
    times.append(time.perf_counter() - t)
times.sort()
print("P50MS", times[25] * 1000)
"""
FLOOD = r"""
import sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
def get(_):
    try:
        return urllib.request.urlopen(sys.argv[1], timeout=60).status
    except Exception as exc:
        return getattr(exc, "code", None) or type(exc).__name__
codes = list(ThreadPoolExecutor(int(sys.argv[2])).map(get, range(int(sys.argv[2]))))
print("OK", codes.count(200), "OTHER", [c for c in codes if c != 200][:5])
"""


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def _site(root: Path) -> None:
    (root / "big.bin").write_bytes(os.urandom(20 * 1024 * 1024))
    (root / "tiny.txt").write_text("tiny")
    (root / "packages").mkdir()
    for i in range(WHEELS):
        name = f"benchpkg{i}"
        files = {
            f"{name}/__init__.py": f"VALUE = {i}\n",
            f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\n"
            "Version: 1.0\n",
            f"{name}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
        }
        record = [f"{n},sha256={_digest(t)},{len(t)}" for n, t in files.items()]
        files[f"{name}-1.0.dist-info/RECORD"] = "\n".join(
            [*record, f"{name}-1.0.dist-info/RECORD,,"]
        )
        wheel = f"{name}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(root / "packages" / wheel, "w") as archive:
            for n, t in files.items():
                archive.writestr(n, t)
        (root / "simple" / name).mkdir(parents=True)
        (root / "simple" / name / "index.html").write_text(
            f'<a href="/packages/{wheel}">{wheel}</a>'
        )
    os.chmod(root, 0o755)


def _tls_server(client: docker.DockerClient, work: Path, network: str, run_id: str) -> str:
    """The same files over HTTPS, from a second server on the network; its host:port."""
    tls = work / "tls"
    tls.mkdir()
    key, chain = issue(new_ca("deckhands bench CA")[0], ["deckhands-bench"])
    (tls / "key.pem").write_bytes(key)
    (tls / "cert.pem").write_bytes(chain)
    (tls / "serve.py").write_text(TLS_SERVER)
    for path in tls.iterdir():
        path.chmod(0o644)
    server = client.containers.run(
        IMAGE,
        ["python3", "/tls/serve.py"],
        entrypoint=[],
        detach=True,
        network=network,
        user="1000:1000",
        volumes={
            str(work / "site"): {"bind": "/srv", "mode": "ro"},
            str(tls): {"bind": "/tls", "mode": "ro"},
        },
        labels={"deckhands.pool": f"bench-{run_id}"},
    )
    server.reload()
    return f"{server.attrs['NetworkSettings']['Networks'][network]['IPAddress']}:{TLS_PORT}"


def _proxies(folder: Path, logs: Path) -> list[subprocess.Popen[bytes]]:
    python = ROOT / ".venv-egress" / "bin" / "python"
    procs = []
    for name in ("egress-0", "egress-1"):
        port = free_port()
        env = {
            **os.environ,
            "DECKHANDS_EGRESS_DIR": str(folder),
            "DECKHANDS_EGRESS_REPLICA": name,
            "DECKHANDS_EGRESS_HEALTH_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [str(python), "-m", "services.egress"],
                cwd=ROOT,
                env=env,
                stdout=(logs / f"{name}.log").open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"egress proxy {name} not ready: see {logs}")
            time.sleep(0.1)
    return procs


def _cpu_s(procs: list[subprocess.Popen[bytes]]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in procs:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def _sh(sandbox: Sandbox, command: str, timeout_s: float = 300) -> str:
    reply = await sandbox.session.bash({"command": command, "timeout_s": timeout_s}, timeout_s + 10)
    return str(reply["output"])


def _number(output: str, key: str) -> float:
    for line in output.splitlines():
        if line.startswith(key):
            return float(line.split()[1])
    raise SystemExit(f"no {key} in: {output[-500:]}")


async def _run(rows: set[str], flood: tuple[int, int]) -> None:
    client = docker.from_env(timeout=60)
    run_id = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="egress-bench-") as tmp:
        work = Path(tmp)
        (work / "site").mkdir()
        (work / "egress").mkdir()
        _site(work / "site")
        network = client.networks.create(f"deckhands-bench-{run_id}", driver="bridge")
        server = procs = None
        sandboxes = DockerSandboxes(
            RuntimeSettings(
                sandbox_image=IMAGE,
                pool_name=f"bench-{run_id}",
                egress_dir=str(work / "egress"),
                sandbox_network_name=network.name,
                allow_network_egress=True,
            ),
            f"bench-{run_id}",
        )
        made: list[Sandbox] = []
        try:
            server = client.containers.run(
                IMAGE,
                ["python3", "-c", SERVER],
                entrypoint=[],
                detach=True,
                network=network.name,
                user="1000:1000",
                volumes={str(work / "site"): {"bind": "/srv", "mode": "ro"}},
                labels={"deckhands.pool": f"bench-{run_id}"},
            )
            server.reload()
            ip = server.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
            site = f"{ip}:{PORT}"
            tls_site = await asyncio.to_thread(_tls_server, client, work, network.name, run_id)
            procs = _proxies(work / "egress", work)
            policy = EgressPolicy(allow=(site, tls_site))

            async def proxied() -> Sandbox:
                egress = SandboxEgress(task_id=f"bench-{uuid.uuid4().hex[:6]}", network=policy)
                sandbox = await sandboxes.create(SandboxShape(egress=egress))
                made.append(sandbox)
                return sandbox

            via_proxy = await proxied()
            via_bridge = await sandboxes.create(SandboxShape(network=network.name))
            made.append(via_bridge)
            await _sh(
                via_proxy,
                f"python3 -c 'import urllib.request as u; u.urlopen(\"http://{site}/tiny.txt\")'",
            )
            print(f"egress proxy vs the plain bridge, server {site}, image {IMAGE}")

            async def both(script: str, url: str, key: str) -> list[float]:
                """The script's figure in the proxied sandbox, then in the bridged one."""
                return [
                    _number(await _sh(sandbox, f"python3 -c '{script}' {url}"), key)
                    for sandbox in (via_proxy, via_bridge)
                ]

            async def downloads(what: str, script: str, url: str, target: str) -> None:
                """Rounds alternate between the two, so that a slower minute of a shared
                machine weighs on both: the median of the rounds' medians of 5 each."""
                rounds = [await both(script, url, "MBPS") for _ in range(DOWNLOAD_ROUNDS)]
                speeds = [sorted(r[i] for r in rounds)[len(rounds) // 2] for i in (0, 1)]
                print(
                    f"download 20 MB{what} (median of {DOWNLOAD_ROUNDS} rounds of 5): proxy "
                    f"{speeds[0]:.0f} MB/s, bridge {speeds[1]:.0f} MB/s = "
                    f"{speeds[0] / speeds[1]:.2f}x ({target})"
                )

            if "download" in rows:
                await downloads("", DOWNLOAD, f"http://{site}/big.bin", "target >= 0.8x")
            if "https" in rows:
                await downloads(
                    " over HTTPS",
                    DOWNLOAD_TLS,
                    f"https://{tls_site}/big.bin",
                    "no target: what pip, npm and git use",
                )
            if "setup" in rows:
                p50 = await both(SETUP, f"http://{site}/tiny.txt", "P50MS")
                print(
                    f"connection + GET, p50 of 50: proxy {p50[0]:.2f} ms, bridge {p50[1]:.2f} ms"
                    f" = +{p50[0] - p50[1]:.2f} ms (target <= +5 ms)"
                )
            if "pip" in rows:
                took: list[float] = []
                names = " ".join(f"benchpkg{i}" for i in range(WHEELS))
                for sandbox in (via_proxy, via_bridge):
                    start = time.perf_counter()
                    out = await _sh(
                        sandbox,
                        # --trusted-host: pip ignores an index on plain HTTP elsewhere than
                        # on loopback.
                        f"pip install -q --target /tmp/t{len(took)} --trusted-host {ip} "
                        f"--index-url http://{site}/simple/ {names} 2>&1 | tail -2; "
                        f"ls /tmp/t{len(took)} | grep -c dist-info",
                    )
                    took.append(time.perf_counter() - start)
                    assert out.strip().splitlines()[-1] == str(WHEELS), out
                print(
                    f"pip install of {WHEELS} wheels: proxy {took[0]:.2f} s, bridge "
                    f"{took[1]:.2f} s = {took[0] / took[1]:.2f}x (target <= 1.3x)"
                )
            if "isolation" in rows:
                # Another task's requests while one sandbox floods the proxy with as many
                # connections as it may hold (its cap, then 429s), against the same alone.
                quiet = await proxied()
                url = f"http://{site}/tiny.txt"
                alone = _number(await _sh(quiet, f"python3 -c '{SETUP}' {url}"), "P50MS")
                flooding = asyncio.create_task(
                    _sh(via_proxy, f"python3 -c '{FLOOD}' http://{site}/big.bin 90")
                )
                await asyncio.sleep(1.0)
                during = _number(await _sh(quiet, f"python3 -c '{SETUP}' {url}"), "P50MS")
                flood_out = await flooding
                print(
                    f"isolation: another sandbox's GET p50 {alone:.2f} ms alone, {during:.2f} "
                    f"ms while one sandbox floods 90 connections of 20 MB = "
                    f"{during / alone:.2f}x (flooder: {flood_out.strip()})"
                )
            if "flood" in rows:
                count, each = flood
                flooders = await asyncio.gather(*(proxied() for _ in range(count - 1)))
                flooders.append(via_proxy)
                cpu_before, start = _cpu_s(procs), time.perf_counter()
                outs = await asyncio.gather(
                    *(
                        _sh(s, f"python3 -c '{FLOOD}' http://{site}/tiny.txt {each}")
                        for s in flooders
                    )
                )
                wall, cpu = time.perf_counter() - start, _cpu_s(procs) - cpu_before
                ok = sum(int(_number(o, "OK")) for o in outs)
                others = [o for o in outs if "OTHER []" not in o]
                print(
                    f"flood: {count} sandboxes x {each} requests at once: {ok} of "
                    f"{count * each} answered 200 in {wall:.1f} s, {len(others)} sandboxes "
                    f"saw another answer {others[:1]}; proxies' CPU {cpu:.1f} s = "
                    f"{cpu / (count * each) * 1000:.2f} ms per request"
                )
        finally:
            for sandbox in made:
                await sandbox.session.close()
                await sandboxes.remove(sandbox.container_id)
            sandboxes.close()
            for proc in procs or []:
                proc.kill()
                proc.wait(10)
            if server is not None:
                server.remove(force=True)
            for leftover in client.containers.list(
                all=True, filters={"label": f"deckhands.pool=bench-{run_id}"}
            ):
                leftover.remove(force=True)
            network.remove()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", default="download,https,setup,pip,isolation,flood")
    parser.add_argument("--flood", default="100x50", help="sandboxes x requests at once")
    args = parser.parse_args()
    count, each = (int(n) for n in args.flood.split("x"))
    asyncio.run(_run(set(args.rows.split(",")), (count, each)))


if __name__ == "__main__":
    main()
