"""What a test server offers a sandbox through the egress proxy: a PEP 503 package index with
one wheel, a git repository served over dumb HTTP, and an npm registry with one package, all
static files under `root` (tests/integration/runtime/test_runtime_egress.py)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

__all__ = ["publish_site"]


def _wheel(root: Path) -> None:
    files = {
        "tinypkg/__init__.py": 'VALUE = "installed-through-the-proxy"\n',
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    files["tinypkg-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    (root / "packages").mkdir()
    with zipfile.ZipFile(root / "packages" / "tinypkg-1.0-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    (root / "simple" / "tinypkg").mkdir(parents=True)
    (root / "simple" / "tinypkg" / "index.html").write_text(
        '<a href="/packages/tinypkg-1.0-py3-none-any.whl">tinypkg-1.0-py3-none-any.whl</a>'
    )


def _git(root: Path) -> None:
    work, bare = root.parent / "repo-work", root / "repo.git"
    env = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run(["git", "init", "-q", str(work)], check=True, timeout=30)
    (work / "README").write_text("cloned-through-the-proxy\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, timeout=30)
    subprocess.run(["git", *env, "-C", str(work), "commit", "-qm", "first"], check=True, timeout=30)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, timeout=30)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True, timeout=30)


def _npm(root: Path, address: str) -> None:
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as tar:
        for name, text in {
            "package/package.json": json.dumps({"name": "tinynpm", "version": "1.0.0"}),
            "package/index.js": 'module.exports = "npm-through-the-proxy";\n',
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = tarball.getvalue()
    (root / "tinynpm" / "-").mkdir(parents=True)
    (root / "tinynpm" / "-" / "tinynpm-1.0.0.tgz").write_bytes(data)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    document = {
        "name": "tinynpm",
        "dist-tags": {"latest": "1.0.0"},
        "versions": {
            "1.0.0": {
                "name": "tinynpm",
                "version": "1.0.0",
                "dist": {
                    "tarball": f"http://{address}/tinynpm/-/tinynpm-1.0.0.tgz",
                    "shasum": hashlib.sha1(data).hexdigest(),
                    "integrity": integrity,
                },
            }
        },
    }
    # Served as the package's URL itself (`/tinynpm`): a folder's index.html.
    (root / "tinynpm" / "index.html").write_text(json.dumps(document))


def publish_site(root: Path, address: str) -> None:
    _wheel(root)
    _git(root)
    _npm(root, address)
