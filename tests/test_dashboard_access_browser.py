"""Access to the dashboard and the API in a real headless Chromium against a real
``chainrt serve``: another site's page cannot cancel or resume runs (a ``text/plain`` form and a
``no-cors`` fetch, the finding), the dashboard logs in with a token kept in an HttpOnly,
SameSite=Strict cookie, and its own Cancel and Resume pass the cross-site checks (the Resume
box's ``30s`` is 30 s)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from browser_fixtures import BROWSER_TEST, checked_page, chromium, submit, wait_status

from chainrt._api_tokens import hash_token
from chainrt.testing.redis_server import free_port
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "access"
OPS = "ops-token-0123456789abcdef"

pytestmark = BROWSER_TEST
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")

ATTACK = """<!doctype html><html><body>
<form id="form" method="POST" enctype="text/plain" action="{target}/v1/runs/{run}/cancel">
<input name='{{"x": "' value='"}}'></form>
<script>
  fetch("{target}/v1/runs/{run}/cancel", {{method: "POST", mode: "no-cors", body: "{{}}"}})
    .finally(() => fetch("{target}/v1/runs/{run}/resume", {{method: "POST", mode: "no-cors"}}))
    .finally(() => {{ document.title = "fetched"; document.getElementById("form").submit(); }});
</script></body></html>"""


@contextmanager
def attacker_site(page_html: str) -> Iterator[str]:
    """Another origin (another port, and named ``localhost``) serving one page."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page_html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def test_another_sites_page_cannot_cancel_or_resume(browser: Any, tmp_path: Path) -> None:
    # No tokens, on loopback: the default a developer runs, where the finding was made.
    with ServeProcess(store=f"sqlite:///{tmp_path / 'runs.db'}", chains=CHAINS) as server:
        submit(server, "nap", "victim", {"seconds": 600.0, "label": "v"})
        wait_status(server, "victim", {"running"})
        page = browser.new_page()
        answers: list[int] = []
        page.on(
            "response",
            lambda r: answers.append(r.status) if "/v1/runs/victim/" in r.url else None,
        )
        with (
            attacker_site(ATTACK.format(target=server.url, run="victim")) as site,
            page.expect_navigation(url=f"{server.url}/v1/runs/victim/cancel"),
        ):
            page.goto(site)  # the page fetches, then posts its form (and navigates)
        assert "cross_origin" in page.content()
        page.close()
        # Both fetches and the form were answered with refusals, and the run runs on.
        assert len(answers) == 3, answers
        assert all(status in (403, 415) for status in answers), answers
        assert server.get("/v1/runs/victim").json()["status"] == "running"
        server.post("/v1/runs/victim/cancel")


def test_login_cookie_and_the_dashboards_own_cancel_and_resume(
    browser: Any, tmp_path: Path
) -> None:
    env = {"CHAINRT_API_TOKENS": f"ops:read,operate,submit:{hash_token(OPS)}"}
    with ServeProcess(store=f"sqlite:///{tmp_path / 'runs.db'}", chains=CHAINS, env=env) as server:
        auth = {"Authorization": f"Bearer {OPS}"}

        def post(path: str, body: dict[str, Any]) -> Any:
            answer = server.post(path, json=body, headers=auth)
            assert answer.status_code == 202, answer.text
            return answer.json()

        def status(run_id: str) -> dict[str, Any]:
            answer: dict[str, Any] = server.get(f"/v1/runs/{run_id}", headers=auth).json()
            return answer

        post(
            "/v1/runs", {"chain": "nap", "input": {"seconds": 600.0, "label": "a"}, "run_id": "n1"}
        )
        with checked_page(browser, server.url) as opened:
            p = opened.page
            p.goto(server.url + "/ui/runs/n1")
            p.wait_for_url("**/ui/login?next=%2Fui%2Fruns%2Fn1")  # its data needed a token
            opened.errors.clear()  # the 401 that sent it here is logged by Chromium
            p.fill("#token", "wrong-token-0123456789")
            p.click("#submit")
            p.wait_for_selector("#message:has-text('not known')")
            opened.errors.clear()
            p.fill("#token", OPS)
            p.click("#submit")
            p.wait_for_url(server.url + "/ui/runs/n1")
            cookies = [c for c in p.context.cookies() if c["name"] == "chainrt_token"]
            assert [(c["httpOnly"], c["sameSite"]) for c in cookies] == [(True, "Strict")]
            assert OPS not in p.evaluate("document.cookie")  # no script can read it
            p.wait_for_selector("li.step[data-step='nap'][data-status='running']")
            p.on("dialog", lambda dialog: dialog.accept())
            p.click("#cancel")
            p.wait_for_selector("#status.s-cancelled")
            used = status("n1")["budget"]["used_ms"]
            p.wait_for_selector("#resume-box:not([hidden])")
            p.fill("#resume-budget", "30s")
            p.click("#resume")
            p.wait_for_selector("#status.s-running")
            budget = status("n1")["budget"]
            # 30 s more than it had used (the finding: 30,000,000 ms).
            assert used + 30_000 <= budget["total_ms"] <= used + 31_000, budget
            p.click("#cancel")
            p.wait_for_selector("#status.s-cancelled")
