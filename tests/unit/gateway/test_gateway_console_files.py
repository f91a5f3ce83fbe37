"""The web console's files as the gateway serves them (no broker: the app is not started), and
the rules the files keep so that the Content-Security-Policy can stay strict. The console at
work in a browser: tests/console/test_console_browser.py."""

from __future__ import annotations

import re

import httpx
import pytest

from services.gateway.main import build_app
from services.gateway.routes.ui import CONTENT_SECURITY_POLICY, UI_DIR, UI_FILES
from services.gateway.settings import GatewaySettings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def http() -> httpx.AsyncClient:
    app = build_app(GatewaySettings())
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


async def test_each_file_is_served_public_with_its_type_and_the_policy(
    http: httpx.AsyncClient,
) -> None:
    async with http:
        for name, media_type in UI_FILES.items():
            answer = await http.get(f"/ui/{name}")
            assert answer.status_code == 200, name
            assert answer.headers["content-type"] == media_type
            assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.content == (UI_DIR / name).read_bytes()
        page = await http.get("/ui/")
        assert page.content == (UI_DIR / "index.html").read_bytes()
        for path in ("/ui/main.py", "/ui/..%2fmain.py", "/ui/context.py", "/ui/index.htm"):
            assert (await http.get(path)).status_code == 404, path
        assert (await http.get("/")).headers["location"] == "/ui/"
        assert (await http.get("/ui/", headers={"Host": "evil.example"})).status_code == 400


def test_every_file_of_the_console_is_listed_and_only_listed_files_are_linked() -> None:
    on_disk = {p.name for p in UI_DIR.iterdir()}
    assert on_disk == set(UI_FILES)
    html = (UI_DIR / "index.html").read_text()
    linked = set(re.findall(r'(?:src|href)="([^"#:]+)"', html))
    assert linked <= set(UI_FILES), linked - set(UI_FILES)
    for name in (n for n in UI_FILES if n.endswith(".js")):
        imported = set(re.findall(r'from "\./([^"]+)"', (UI_DIR / name).read_text()))
        assert imported <= set(UI_FILES), (name, imported)


def test_the_files_keep_to_what_the_policy_allows() -> None:
    """No inline script, style or handler (the policy would block them), and no markup built
    from strings in the scripts: every text of a task reaches the page as text."""
    html = (UI_DIR / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script>"
    assert "<style" not in html and " style=" not in html
    assert not re.search(r"\son[a-z]+=", html), "inline event handler"
    for name in (n for n in UI_FILES if n.endswith(".js")):
        code = (UI_DIR / name).read_text()
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert banned not in code, (name, banned)
        assert "new Function" not in code and "localStorage" not in code, name
        assert "document.cookie" not in code, name
