"""A task's repository, fetched by the runtime and checked out in its workspace.

The work is split where the risk is:

1. **Fetch** (network), in the runtime's process: `git clone --no-checkout` into a temporary
   directory. Only git's own files are written there (objects, refs, our config): no path of
   the repository's tree is, no hook runs (an empty template), no submodule is fetched, only the
   URL schemes the operator allows (`GIT_ALLOW_PROTOCOL`), objects are checked
   (`transfer.fsckObjects`), no prompt, no system or user git config. A token (the tenant's
   secret named by `token_secret`) is given as an HTTP header through the environment, never in
   the URL, a file, or `.git/config`. The clone is killed past its deadline or its size bound.
   The ref is resolved here (branch, tag or commit) and recorded as `refs/deckhands/start`.
   The URL's host gets the address policy of shared/address_policy.py (no loopback, private,
   link-local, metadata or other special address, however written): its name is resolved
   once, every address checked, and git is pinned to the checked one (http(s): curl's resolve
   list, `http.curloptResolve`; git:// and ssh://: the address written in the URL, the name
   put back as `origin` after the clone), with no redirect followed. Hosts the operator names
   in DECKHANDS_REPOSITORY_ALLOWED_HOSTS are fetched as they resolve, unchecked. A failure's
   reason says what failed, never what the remote or git said (that would make a port scanner
   of the task API): the detail is logged here, without the token.
2. **Checkout** (the repository's tree: file names and contents its author chose), in a helper
   container of the sandbox image that mounts only the task's workspace (workspace_helper.py),
   with no network: `.git` is copied into /workspace, then `git reset --hard` writes the tree.
   Bounded by the workspace's own quota and a deadline.

The sandbox itself never gets a network for this.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import signal
import tarfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from shared.address_policy import (
    HostRefused,
    LookupFailed,
    Resolver,
    allowed_host_names,
    canonical_host,
    checked_address,
    default_port,
    literal_address,
    system_resolver,
    url_host_refused,
)
from shared.workspace import RepositorySpec, bad_ref, bad_repository_url

from .errors import CheckoutFailed
from .workspace_archive import SANDBOX_UID

__all__ = [
    "START_REF",
    "Fetched",
    "fetch",
    "tar_git_dir",
]

log = logging.getLogger("deckhands.runtime.checkout")

START_REF = "refs/deckhands/start"
_HEX = re.compile(r"^[0-9a-f]{7,64}$")
_POLL_S = 0.25
_LOOKUP_TIMEOUT_S = 30.0
_NOT_FETCHED = "the repository could not be fetched"
REFUSED = f"{_NOT_FETCHED}: host refused by the address policy"
# A name that does not resolve and one that resolves to a refused address get the same
# answer: a tenant learns nothing of which internal names exist.
NAME_REFUSED = f"{_NOT_FETCHED}: host not found or refused by the address policy"


@dataclass(frozen=True)
class Fetched:
    git_dir: Path
    commit: str
    branch: str | None  # None: a detached HEAD (a tag or a commit)


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _git_env(workdir: Path, schemes: list[str], token: str | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ALLOW_PROTOCOL": ":".join(schemes),
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_LFS_SKIP_SMUDGE": "1",
    }
    if token:
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        env |= {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
        }
    return env


async def _git(
    args: list[str], env: dict[str, str], cwd: Path, timeout_s: float
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(text: str, secret: str | None) -> str:
    if secret:
        basic = base64.b64encode(f"x-access-token:{secret}".encode()).decode()
        text = text.replace(basic, "<secret>").replace(secret, "<secret>")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-3:])[:500] or "no message"


@dataclass(frozen=True)
class _Route:
    """How git reaches the repository: the URL it is given, its settings for this clone, and
    the URL `origin` is set to after it (the address was written in the one given)."""

    url: str
    config: list[str] = field(default_factory=list)
    origin: str | None = None


def _netloc(host: str, port: int | None) -> str:
    literal = f"[{host}]" if ":" in host else host
    return literal if port is None else f"{literal}:{port}"


async def _route(url: str, allowed: frozenset[str], resolve: Resolver) -> _Route:
    """The address policy applied to `url`'s host, and git pinned to the address checked.
    CheckoutFailed (generic; the detail is logged) if it is refused or does not resolve."""
    parts = urlsplit(url)
    host = canonical_host(parts.hostname or "")
    port = parts.port
    no_redirect = ["-c", "http.followRedirects=false"]  # a redirect could lead anywhere
    why = url_host_refused(url, allowed)
    if why is not None:
        log.warning("repository %s refused by the address policy: %s", url, why)
        raise CheckoutFailed(REFUSED)
    canonical = parts._replace(netloc=_netloc(host, port), fragment="").geturl()
    if host in allowed:
        return _Route(canonical, no_redirect)
    try:
        async with asyncio.timeout(_LOOKUP_TIMEOUT_S):
            address = await checked_address(host, port or default_port(parts.scheme), resolve)
    except (HostRefused, LookupFailed, TimeoutError) as exc:
        detail = str(exc) or "the lookup timed out"
        log.warning("repository %s refused by the address policy: %s", url, detail)
        raise CheckoutFailed(NAME_REFUSED) from None
    if parts.scheme in ("http", "https"):
        if literal_address(host) is not None:
            return _Route(canonical, no_redirect)  # an address: nothing for curl to resolve
        pin = f"{host}:{port or default_port(parts.scheme)}:{_netloc(address, None)}"
        return _Route(canonical, [*no_redirect, "-c", f"http.curloptResolve={pin}"])
    # git:// and ssh:// resolve the host themselves: they are given the address.
    pinned = parts._replace(netloc=_netloc(address, port), fragment="").geturl()
    return _Route(pinned, no_redirect, origin=canonical)


def _clone_failure(stderr: str) -> str:
    """What failed, in our words: git's message quotes the remote (its banner, its error
    page), which must not reach the tenant."""
    text = stderr.lower()
    if "fsck" in text or "invalid object" in text or "object corrupt" in text:
        return "its objects failed git's integrity checks"
    if re.search(r"returned error: 30[1278]", text):
        return "the server redirected elsewhere (redirects are not followed)"
    if (
        "returned error: 401" in text
        or "returned error: 403" in text
        or "could not read username" in text
        or "authentication failed" in text
    ):
        return "access refused (token_secret missing or not accepted)"
    if any(
        words in text
        for words in (
            "not found",
            "not exported",
            "does not appear to be a git repository",
            "is this a git repository",
            "returned error:",
            "no such repository",
        )
    ):
        return "not a git repository or not found"
    if "timed out" in text or "timeout" in text:
        return "timed out"
    return "connection failed"


async def fetch(
    spec: RepositorySpec,
    token: str | None,
    workdir: Path,
    *,
    schemes: list[str],
    timeout_s: float,
    max_bytes: int,
    allowed_hosts: Collection[str] | None = None,
    resolve: Resolver = system_resolver,
) -> Fetched:
    """Clone `spec` without a working tree into `workdir/repo`, resolve its ref and point HEAD
    at it. CheckoutFailed names what went wrong. `allowed_hosts`: the hosts the address policy
    lets through unchecked (None: DECKHANDS_REPOSITORY_ALLOWED_HOSTS from the environment)."""
    why = bad_repository_url(spec.url, schemes) or (spec.ref and bad_ref(spec.ref))
    if why:
        raise CheckoutFailed(why)
    if allowed_hosts is None:
        from .settings import RuntimeSettings

        allowed_hosts = RuntimeSettings().repository_allowed_hosts
    route = await _route(spec.url, allowed_host_names(allowed_hosts), resolve)
    env = _git_env(workdir, schemes, token)
    dest = workdir / "repo"
    clone = [
        "-c",
        "transfer.fsckObjects=true",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "submodule.recurse=false",
        *route.config,
        "clone",
        "--no-checkout",
        "--template=",
        "--quiet",
        "--",
        route.url,
        str(dest),
    ]
    proc = await asyncio.create_subprocess_exec(
        "git",
        *clone,
        cwd=workdir,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stderr is not None
    errors = asyncio.ensure_future(proc.stderr.read(64 * 1024))
    try:
        await _bounded(proc, dest, spec.url, timeout_s, max_bytes)
    except BaseException:
        _kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 10)
        errors.cancel()
        raise
    err = (await errors).decode("utf-8", "replace")
    if proc.returncode != 0:
        log.warning("repository %s: git clone failed: %s", spec.url, _tail(err, token))
        raise CheckoutFailed(f"{_NOT_FETCHED}: {_clone_failure(err)}")
    if await asyncio.to_thread(_dir_bytes, dest) > max_bytes:
        raise CheckoutFailed(f"the repository {spec.url} is larger than {max_bytes} bytes")
    if route.origin is not None:
        await _run(dest, env, "remote", "set-url", "origin", route.origin)
    return await _point_head(spec, dest, env, timeout_s)


async def _bounded(
    proc: asyncio.subprocess.Process, dest: Path, url: str, timeout_s: float, max_bytes: int
) -> None:
    """Wait for the clone `proc` into `dest`; CheckoutFailed once it takes longer than
    `timeout_s` or `dest` grows larger than `max_bytes` (the caller then kills it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), _POLL_S)
            break
        except TimeoutError:
            pass
        if loop.time() > deadline:
            raise CheckoutFailed(
                f"{_NOT_FETCHED}: timed out (after {timeout_s:g}s, "
                "DECKHANDS_REPOSITORY_CLONE_TIMEOUT_S)"
            )
        # A stat is quick enough for the loop; the walk through the tree goes to a thread.
        size = await asyncio.to_thread(_dir_bytes, dest) if dest.exists() else 0  # noqa: ASYNC240
        if size > max_bytes:
            raise CheckoutFailed(
                f"the repository {url} is larger than {max_bytes} bytes "
                "(DECKHANDS_REPOSITORY_MAX_BYTES)"
            )


async def _rev(dest: Path, env: dict[str, str], name: str) -> str | None:
    code, out, _ = await _git(["rev-parse", "--verify", "-q", f"{name}^{{commit}}"], env, dest, 30)
    return out.strip() if code == 0 and out.strip() else None


async def _run(dest: Path, env: dict[str, str], *args: str) -> None:
    code, _, err = await _git(list(args), env, dest, 60)
    if code != 0:
        log.warning("repository in %s: git %s failed: %s", dest, args[0], _tail(err, None))
        raise CheckoutFailed(f"git {args[0]} failed on the fetched repository")


async def _point_head(
    spec: RepositorySpec, dest: Path, env: dict[str, str], timeout_s: float
) -> Fetched:
    code, out, _ = await _git(["symbolic-ref", "-q", "--short", "HEAD"], env, dest, 30)
    default = out.strip() if code == 0 else None
    ref = spec.ref
    branch: str | None = default
    if ref is None or ref == default:
        commit = await _rev(dest, env, "HEAD")
        if commit is None:
            raise CheckoutFailed(f"the repository {spec.url} has no commit on its default branch")
    elif (commit := await _rev(dest, env, f"refs/remotes/origin/{ref}")) is not None:
        branch = ref
        await _run(dest, env, "branch", "--force", "--track", ref, f"origin/{ref}")
        await _run(dest, env, "symbolic-ref", "HEAD", f"refs/heads/{ref}")
    elif (commit := await _rev(dest, env, f"refs/tags/{ref}")) is not None or (
        _HEX.match(ref) and (commit := await _rev(dest, env, ref)) is not None
    ):
        branch = None
        await _run(dest, env, "update-ref", "--no-deref", "HEAD", commit)
    else:
        raise CheckoutFailed(f"the repository {spec.url} has no branch, tag or commit {ref!r}")
    await _run(dest, env, "update-ref", START_REF, commit)
    return Fetched(git_dir=dest / ".git", commit=commit, branch=branch)


def tar_git_dir(git_dir: Path, out: Path) -> None:
    """`git_dir` as a tar of `.git/...` owned by the sandbox user: directories and regular
    files only (git writes nothing else there). Blocking."""

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isdir() or info.isreg()):
            return None
        info.uid = info.gid = SANDBOX_UID
        info.uname = info.gname = "sandbox"
        info.mode = (info.mode & 0o755) | (0o700 if info.isdir() else 0o600)
        return info

    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(git_dir, arcname=".git", recursive=True, filter=owned)
