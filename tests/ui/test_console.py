"""The web console at /ui, in a real headless Chromium against a real server:
sign in with a key, see a lock held by a client, force-release it through the
page and see that client lose its lease; data is shown as text and never runs;
a wrong key and a reader key are told what they cannot do; the pages are served
with a strict Content-Security-Policy and the browser reports no violation.

Screenshots of each page go to docs/images/ when FENCEPOST_UPDATE_SCREENSHOTS=1
(they show times and IDs, so a normal run leaves the committed ones alone)."""

from __future__ import annotations

import os
import re
import struct
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Callable, TypeVar

import httpx
import pytest

import fencepost
from support import ServerProcess, lock_headers, unique_name

pytestmark = pytest.mark.timeout(120)

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
SCREENSHOTS = ("console-locks.png", "console-force-release.png", "console-pools.png",
               "console-keys.png")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
WAIT_S = 15  # the page polls every 3 s; anything slower than this is a failure
T = TypeVar("T")
# Every request the page makes from here on, as "METHOD url".
COUNT_REQUESTS = """
window.requestsSeen = [];
const plain = window.fetch;
window.fetch = (input, init) => {
  window.requestsSeen.push(`${(init && init.method) || "GET"} ${input}`);
  return plain(input, init);
};
"""


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = WAIT_S) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as error:  # noqa: BLE001 - the page may be re-rendering
            last_error = error
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})")


def by_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def visible(driver: Any, selector: str) -> Any:
    return wait_for(f"{selector} to show",
                    lambda: next((e for e in by_css(driver, selector) if e.is_displayed()), None))


def open_console(driver: Any, server: ServerProcess, key: str, view: str = "locks") -> None:
    """A fresh tab state (no key kept), then sign in by typing the key."""
    # Forget the key on a page of the same origin that runs no console script
    # (the console would sign in again with it while it loads).
    driver.get(f"{server.base_url}/openapi.json")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{server.base_url}/ui#{view}")
    field = visible(driver, "#api-key")
    field.send_keys(key)
    visible(driver, "#sign-in-button").click()


def signed_in(driver: Any) -> str:
    return str(visible(driver, "#who-text").text)


def browser_problems(driver: Any) -> list[str]:
    """Script errors and CSP violations the browser logged since the last call."""
    entries = driver.get_log("browser")
    return [e["message"] for e in entries
            if "Content Security Policy" in e["message"] or "Uncaught" in e["message"]]


def screenshot(driver: Any, name: str, tmp_path: Path) -> None:
    target = IMAGES if os.environ.get("FENCEPOST_UPDATE_SCREENSHOTS") == "1" else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(target / name))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# --- the routes, without a browser ------------------------------------------------


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "style" or "style" in names or any(n.startswith("on") for n in names):
            self.inline.append(self.get_starttag_text() or tag)
        if tag == "script":
            if not names.get("src"):
                self.inline.append("a script without src")
            self.sources.append(str(names["src"]))
        if tag == "link" and names.get("rel") == "stylesheet":
            self.sources.append(str(names["href"]))


def test_the_page_and_its_files_come_with_a_strict_policy(console_server: ServerProcess
                                                          ) -> None:
    base = console_server.base_url
    page = httpx.get(f"{base}/ui", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    markup = _Markup()
    markup.feed(page.text)
    assert markup.inline == [], "no inline script, style or event handler"
    assert sorted(markup.sources) == ["ui/console.css", "ui/console.js"]
    kinds = {"ui/console.js": "text/javascript; charset=utf-8",
             "ui/console.css": "text/css; charset=utf-8"}
    for answer, kind in [(page, "text/html; charset=utf-8")] + [
        (httpx.get(f"{base}/{source}", timeout=10), kinds[source]) for source in markup.sources
    ]:
        assert answer.status_code == 200, answer.url
        assert answer.headers["content-type"] == kind
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert "set-cookie" not in answer.headers
    js = httpx.get(f"{base}/ui/console.js", timeout=10).text
    for use in (".innerHTML", ".outerHTML", "insertAdjacentHTML", "document.write",
                "localStorage.", "document.cookie", "eval("):
        assert use not in js, f"the console must not use {use}"


@pytest.mark.parametrize("path", [
    "/ui/index.html", "/ui/nothing.js", "/ui/..%2F..%2Fpyproject.toml", "/ui/%2e%2e",
    "/ui/../openapi.json/x", "/ui/console.js/x", "/ui/", "/ui/CONSOLE.JS", "/ui/console.js%00",
])
def test_anything_but_the_allowlisted_files_is_404(console_server: ServerProcess,
                                                    path: str) -> None:
    resp = httpx.get(f"{console_server.base_url}{path}", timeout=10)
    assert resp.status_code == 404, (path, resp.text)
    assert resp.json()["error"]["code"] == "not_found"


def test_the_console_files_ship_in_the_package() -> None:
    from importlib.resources import files

    from fencepost.server.routes import ui

    folder = files("fencepost.server").joinpath("ui")
    for name in (ui.PAGE, *ui.ASSETS):
        assert folder.joinpath(name).is_file(), name


# --- in the browser -----------------------------------------------------------------


def test_an_admin_force_releases_a_held_lock_and_its_holder_loses_the_lease(
        console_server: ServerProcess, browser: Any, tmp_path: Path) -> None:
    driver = browser
    name = unique_name("deploy-prod")
    member = console_server.create_key("member", name="deployer")["key"]
    with fencepost.Client(console_server.base_url, member) as client, client.lock(
        name, ttl=5, renew_every=0.3, operation="deploy", raise_on_loss=False,
        metadata={"host": "build-7", "pid": 4242},
    ) as hold:
        open_console(driver, console_server, console_server.admin_key)
        assert "admin key" in signed_in(driver)
        row = visible(driver, f'tr[data-lock="{name}"]')
        cells = [c.text for c in row.find_elements("css selector", "td")]
        assert cells[2] == "deploy" and cells[3] == str(hold.fencing_token), cells
        visible(driver, f'button[data-lock="{name}"]').click()
        visible(driver, "#lock-detail")
        wait_for("the lock's details", lambda: driver.find_element(
            "id", "lock-detail-key").text == name)
        assert '"host": "build-7"' in driver.find_element("id", "lock-detail-metadata").text
        screenshot(driver, "console-locks.png", tmp_path)

        visible(driver, f'button[data-force-release="{name}"]').click()
        dialog = visible(driver, "dialog#confirm")
        said = dialog.text
        for fact in (name, "deploy", str(hold.fencing_token), "lease_lost"):
            assert fact in said, (fact, said)
        screenshot(driver, "console-force-release.png", tmp_path)
        assert not hold.lost, "nothing happens before the confirmation"
        driver.find_element("id", "confirm-ok").click()

        notice = visible(driver, "#notice")
        assert f"Released lock {name}" in notice.text
        assert str(hold.fencing_token) in notice.text
        assert hold.lost_event.wait(WAIT_S), "the holder's next renewal must fail"
    assert hold.loss is not None and hold.loss.reason == "force_released"
    assert hold.loss.error is not None and hold.loss.error.code == "lease_lost"
    wait_for("the row to go", lambda: not by_css(driver, f'tr[data-lock="{name}"]'))
    assert browser_problems(driver) == []


def test_cancel_in_the_confirmation_releases_nothing(console_server: ServerProcess,
                                                     browser: Any) -> None:
    driver = browser
    name = unique_name("keep-me")
    with console_server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 60, "operation": "backup"})
        assert resp.status_code == 201, resp.text
        open_console(driver, console_server, console_server.admin_key)
        visible(driver, f'button[data-force-release="{name}"]').click()
        driver.execute_script(COUNT_REQUESTS)
        visible(driver, "#confirm-cancel").click()
        wait_for("the dialog to close", lambda: not driver.find_element(
            "id", "confirm").is_displayed())
        # A wrongly wired button would act at once; the page's next poll comes after.
        wait_for("the page's next poll", lambda: driver.execute_script(
            "return window.requestsSeen.some((r) => r.startsWith('GET '))"))
        assert not any(r.startswith("DELETE") for r in driver.execute_script(
            "return window.requestsSeen")), "cancel sent a release"
        assert c.get(f"/v1/locks/{name}").json()["held"] is True


def test_a_lock_s_operation_and_metadata_are_shown_as_text_and_never_run(
        console_server: ServerProcess, browser: Any) -> None:
    driver = browser
    name = unique_name("xss")
    hostile = "<img src=x onerror=alert(1)>"
    metadata = {"note": "<script>window.pwned = 1</script>",
                "link": "<img src=x onerror=window.pwned=2>"}
    with console_server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 60, "operation": hostile, "metadata": metadata})
        assert resp.status_code == 201, resp.text
    open_console(driver, console_server, console_server.admin_key)
    row = visible(driver, f'tr[data-lock="{name}"]')
    assert row.find_element("css selector", "td.operation").text == hostile
    visible(driver, f'button[data-lock="{name}"]').click()
    shown = wait_for("the metadata", lambda: driver.find_element(
        "id", "lock-detail-metadata").text)
    assert metadata["note"] in shown and metadata["link"] in shown
    assert by_css(driver, "main img") == [], "markup from the data became elements"
    assert driver.execute_script("return window.pwned === undefined") is True
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        _ = driver.switch_to.alert.text
    assert browser_problems(driver) == []


def test_a_wrong_key_is_told_so_and_not_kept(console_server: ServerProcess,
                                             browser: Any) -> None:
    driver = browser
    open_console(driver, console_server, "fp_not_a_key_of_this_server_000000000000")
    message = visible(driver, "#message").text
    assert "refused this key" in message and "401" in message, message
    assert driver.find_element("id", "sign-in").is_displayed()
    assert not driver.find_element("id", "tabs").is_displayed()
    assert driver.execute_script("return sessionStorage.length") == 0


def test_the_key_is_kept_for_the_tab_only(console_server: ServerProcess, browser: Any) -> None:
    driver = browser
    open_console(driver, console_server, console_server.admin_key)
    signed_in(driver)
    assert driver.execute_script("return localStorage.length") == 0
    assert driver.get_cookies() == []
    assert console_server.admin_key in driver.execute_script(
        "return Object.values(sessionStorage)")
    driver.refresh()  # the same tab keeps it
    assert "admin key" in signed_in(driver)
    visible(driver, "#sign-out").click()
    visible(driver, "#sign-in")
    assert driver.execute_script("return sessionStorage.length") == 0


def test_a_reader_sees_locks_but_no_buttons_that_change_anything(
        console_server: ServerProcess, browser: Any) -> None:
    driver = browser
    name = unique_name("read-only")
    with console_server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 60, "operation": "report"})
        assert resp.status_code == 201, resp.text
    reader = console_server.create_key("reader", name="dashboard")["key"]
    open_console(driver, console_server, reader)
    assert "reader key" in signed_in(driver)
    visible(driver, f'tr[data-lock="{name}"]')
    assert by_css(driver, "[data-force-release]") == []
    visible(driver, "#tab-keys").click()
    refused = visible(driver, "#keys-refused").text
    assert "Only an admin key can list keys" in refused and "403" in refused, refused
    assert by_css(driver, "[data-revoke]") == []


def test_pools_show_limits_learned_state_and_a_live_chart(console_server: ServerProcess,
                                                          browser: Any, tmp_path: Path) -> None:
    driver = browser
    pool = unique_name("upstream")
    with console_server.client() as c:
        resp = c.put(f"/v1/pools/{pool}", json={"limit": 4, "adaptive": True, "min_limit": 1})
        assert resp.status_code == 201, resp.text

        def traffic(throttled: bool) -> None:
            slot = c.post(f"/v1/pools/{pool}/lock/acquire")
            assert slot.status_code == 200, slot.text
            outcome = {"status": 429, "throttled": 1} if throttled else {"status": 200}
            done = c.post(f"/v1/pools/{pool}/lock/{slot.json()['slot_id']}/release",
                          json=outcome)
            assert done.status_code == 200, done.text

        open_console(driver, console_server, console_server.admin_key, view="pools")
        visible(driver, f'button[data-pool="{pool}"]').click()
        visible(driver, "#pool-detail")
        assert "Effective limit" in driver.find_element("id", "pool-detail-state").text

        sent = {"count": 0}

        def chart_shows_traffic() -> bool:
            # Steady traffic, one throttle in four, until four polls have drawn some.
            traffic(throttled=sent["count"] % 4 == 0)
            sent["count"] += 1
            summary = driver.find_element("id", "pool-chart-summary").text
            polls = re.match(r"Last (\d+) polls: (\d+) admissions, (\d+) throttles", summary)
            if polls is None:
                return False
            return int(polls[1]) >= 4 and int(polls[2]) > 0 and int(polls[3]) > 0

        wait_for("the chart to count admissions and throttles", chart_shows_traffic, 30)
        row_text = visible(driver, f'button[data-pool="{pool}"]').find_element(
            "xpath", "./ancestor::tr").text
        assert "4" in row_text
        learned = driver.find_element("id", "pool-detail-learned").text
        assert learned and "not reported" not in learned
        drawn = driver.execute_script(
            "const c = document.getElementById('pool-chart');"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 0; i < d.length; i += 4) {"
            "  if (d[i] > 200 && d[i + 1] < 80 && d[i + 2] < 80) n++; } return n;")
        assert drawn > 0, "the throttles line is drawn in red on the canvas"
        screenshot(driver, "console-pools.png", tmp_path)
    assert browser_problems(driver) == []


def test_an_admin_revokes_a_key_after_a_confirmation_naming_it(
        console_server: ServerProcess, browser: Any, tmp_path: Path) -> None:
    driver = browser
    made = console_server.create_key("member", name="ci-runner")
    open_console(driver, console_server, console_server.admin_key, view="keys")
    row = visible(driver, f'tr[data-key="{made["id"]}"]')
    assert "ci-runner" in row.text and "member" in row.text
    visible(driver, f'button[data-revoke="{made["id"]}"]').click()
    said = visible(driver, "dialog#confirm").text
    assert "ci-runner" in said and made["id"] in said, said
    driver.find_element("id", "confirm-ok").click()
    assert made["id"] in visible(driver, "#notice").text
    whoami = httpx.get(f"{console_server.base_url}/v1/whoami", timeout=10,
                       headers={"Authorization": f"Bearer {made['key']}"})
    assert whoami.status_code == 401
    wait_for("the row to show the revocation", lambda: driver.find_element(
        "css selector", f'tr[data-key="{made["id"]}"]').get_attribute("data-state") == "revoked")
    assert by_css(driver, f'button[data-revoke="{made["id"]}"]') == []
    assert browser_problems(driver) == []


def test_keys_read_as_lineages_and_an_admin_retires_one(
        console_server: ServerProcess, browser: Any, tmp_path: Path) -> None:
    driver = browser
    first = console_server.create_key("member", name="deployer", expires_in_seconds=86400)
    successor = httpx.post(f"{console_server.base_url}/v1/keys/refresh", timeout=10,
                           headers={"Authorization": f"Bearer {first['key']}"}).json()
    open_console(driver, console_server, console_server.admin_key, view="keys")
    parent_row = visible(driver, f'tr[data-key="{first["id"]}"]')
    child_row = visible(driver, f'tr[data-key="{successor["id"]}"]')
    # The successor comes right under its key, one step in, naming where it came from.
    rows = [r.get_attribute("data-key") for r in by_css(driver, "#keys-body tr")]
    assert rows.index(successor["id"]) == rows.index(first["id"]) + 1, rows
    assert child_row.text.startswith("\u21b3 deployer"), child_row.text
    assert f"deployer {first['id']}" in child_row.text
    assert "active" in parent_row.text and "active" in child_row.text
    screenshot(driver, "console-keys.png", tmp_path)
    visible(driver, f'button[data-retire="{first["id"]}"]').click()
    said = visible(driver, "dialog#confirm").text
    assert first["id"] in said and "refreshed from it keep working" in said, said
    driver.find_element("id", "confirm-ok").click()
    assert first["id"] in visible(driver, "#notice").text
    refused = httpx.get(f"{console_server.base_url}/v1/whoami", timeout=10,
                        headers={"Authorization": f"Bearer {first['key']}"})
    kept = httpx.get(f"{console_server.base_url}/v1/whoami", timeout=10,
                     headers={"Authorization": f"Bearer {successor['key']}"})
    assert (refused.status_code, kept.status_code) == (401, 200)
    wait_for("the row to show the retirement", lambda: driver.find_element(
        "css selector", f'tr[data-key="{first["id"]}"]').get_attribute("data-state") == "retired")
    row = driver.find_element("css selector", f'tr[data-key="{first["id"]}"]')
    assert "retired" in row.text
    # A retired key can still be revoked (which takes its successor), not retired again.
    assert by_css(driver, f'button[data-retire="{first["id"]}"]') == []
    assert by_css(driver, f'button[data-revoke="{first["id"]}"]') != []
    assert browser_problems(driver) == []


def test_the_docs_show_a_screenshot_of_each_page() -> None:
    docs = (IMAGES.parent / "console.md").read_text()
    for name in SCREENSHOTS:
        assert f"images/{name}" in docs, name
        width, height = png_size(IMAGES / name)
        assert width >= 800 and height >= 400, (name, width, height)
        assert (IMAGES / name).stat().st_size < 300_000, f"{name}: keep screenshots small"


# What the server adds to a lock where it reports holders and lines (SPEC §3.4),
# put into the answers the page receives, so that their rendering is checked
# whether or not this server already sends them; names carry markup on purpose.
FAKE_HOLDER_AND_LINE = """
const real = window.fetch;
window.fetch = async (input, init) => {
  const response = await real(input, init);
  if (!/v1\\/locks[\\/?]/.test(String(input)) || !response.ok) return response;
  const body = await response.json();
  const add = (lock) => Object.assign(lock, {
    holder: {key_id: "key_holder0001", key_name: "<b>deployer</b>"},
    waiters: 2,
    line: [
      {key_id: "key_waiter0001", key_name: "ci-1", since_at: "2026-12-01T07:00:00.000Z",
       gives_up_at: "2026-12-01T07:05:00.000Z"},
      {key_id: "key_waiter0002", key_name: null, since_at: "2026-12-01T07:01:00.000Z",
       gives_up_at: "2026-12-01T07:06:00.000Z"},
    ],
  });
  if (Array.isArray(body.locks)) body.locks.forEach(add); else add(body);
  return new Response(JSON.stringify(body), {status: response.status,
                                              headers: response.headers});
};
"""


def test_a_lock_s_holder_and_line_are_shown_when_the_server_reports_them(
        console_server: ServerProcess, browser: Any) -> None:
    driver = browser
    name = unique_name("queued")
    with console_server.client() as c:
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 60, "operation": "migrate"})
        assert resp.status_code == 201, resp.text
    open_console(driver, console_server, console_server.admin_key)
    signed_in(driver)
    driver.execute_script(FAKE_HOLDER_AND_LINE)
    wait_for("the holder in the table", lambda: "<b>deployer</b> (key_holder0001)" in
             driver.find_element("css selector", f'tr[data-lock="{name}"]').text)
    visible(driver, f'button[data-lock="{name}"]').click()
    line = visible(driver, "#lock-line-table")
    rows = [r.text for r in line.find_elements("css selector", "tbody tr")]
    assert len(rows) == 2, rows
    assert rows[0].startswith("1 ci-1 key_waiter0001 2026-12-01T07:00:00.000Z"), rows
    assert rows[1].startswith("2 — key_waiter0002"), rows
    assert "(2 waiting)" in driver.find_element("id", "lock-line-count").text
    assert by_css(driver, "main b") == [], "a key name's markup became an element"
    assert browser_problems(driver) == []


def test_a_member_is_offered_a_force_release_only_for_its_own_lease(
        console_server: ServerProcess, browser: Any) -> None:
    """SPEC §3.5: the owner of a lease may force-release it. The page offers the
    button where `holder` names the member's own key (filled in below where this
    server does not report holders yet) and shows the server's answer."""
    from fencepost.server.routes.table import ROUTES

    driver = browser
    member = console_server.create_key("member", name="crashed-worker")
    own, other = unique_name("own"), unique_name("other")
    for name, key in ((own, member["key"]), (other, console_server.admin_key)):
        with console_server.client(key) as c:
            resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                         json={"ttl_seconds": 60, "operation": "nightly"})
            assert resp.status_code == 201, resp.text
    open_console(driver, console_server, member["key"])
    assert "member key" in signed_in(driver)
    driver.execute_script(
        """
        const [own, mine] = arguments;
        const real = window.fetch;
        window.fetch = async (input, init) => {
          const response = await real(input, init);
          if (!/v1\\/locks[\\/?]/.test(String(input)) || !response.ok) return response;
          const body = await response.json();
          const fill = (lock) => {
            if (!("holder" in lock)) lock.holder = lock.key === own
              ? {key_id: mine, key_name: "crashed-worker"}
              : {key_id: "key_someone_else", key_name: "bootstrap"};
          };
          if (Array.isArray(body.locks)) body.locks.forEach(fill); else fill(body);
          return new Response(JSON.stringify(body), {status: response.status,
                                                     headers: response.headers});
        };
        """, own, member["id"])
    button = visible(driver, f'button[data-force-release="{own}"]')
    visible(driver, f'tr[data-lock="{other}"]')
    assert by_css(driver, f'button[data-force-release="{other}"]') == []
    button.click()
    visible(driver, "#confirm-ok").click()
    force = next(r for r in ROUTES if r.operation_id == "forceReleaseLock")
    if force.role is not None and force.role.label == "admin":
        # This server lets only admins force-release: the refusal is shown as such.
        message = visible(driver, "#message").text
        assert "may not do that (403" in message, message
    else:
        assert f"Released lock {own}" in visible(driver, "#notice").text
    assert browser_problems(driver) == []


def test_a_proxied_pool_shows_its_upstream_and_header_names_only(
        console_server: ServerProcess, browser: Any) -> None:
    driver = browser
    pool = unique_name("proxied")
    secret = "sk-console-secret-31415"
    with console_server.client() as c:
        resp = c.put(f"/v1/pools/{pool}", json={"limit": 2, "upstream": {
            "base_url": "https://api.example.com/v1",
            "headers": {"Authorization": f"Bearer {secret}", "OpenAI-Organization": "org-1"}}})
        assert resp.status_code == 201, resp.text
    open_console(driver, console_server, console_server.admin_key, view="pools")
    visible(driver, f'button[data-pool="{pool}"]').click()
    wait_for("the pool's upstream", lambda: "https://api.example.com/v1" in
             driver.find_element("id", "pool-detail-state").text)
    shown = driver.find_element("id", "pool-detail-state").text
    assert "Authorization, OpenAI-Organization" in shown
    assert secret not in driver.page_source and "org-1" not in driver.page_source
    assert browser_problems(driver) == []


def test_a_pool_s_unit_budget_is_shown(console_server: ServerProcess, browser: Any) -> None:
    """SPEC §4.6: the configured budget, the one paced by, and what is left."""
    driver = browser
    pool = unique_name("tokens")
    with console_server.client() as c:
        resp = c.put(f"/v1/pools/{pool}", json={"limit": 4, "cost_per_minute": 90_000})
        assert resp.status_code == 201, resp.text
        granted = c.post(f"/v1/pools/{pool}/lock/acquire", json={"cost": 1_200})
        assert granted.status_code == 200, granted.text
    open_console(driver, console_server, console_server.admin_key, view="pools")
    visible(driver, f'button[data-pool="{pool}"]').click()
    wait_for("the pool's budget", lambda: "Cost budget (per minute)" in
             driver.find_element("id", "pool-detail-state").text)
    shown = driver.find_element("id", "pool-detail-state").text
    assert "90000" in shown.replace(",", "")
    left = shown.split("Cost left this minute")[1].split()[0].replace(",", "")
    assert left.isdigit() and int(left) <= 90_000 - 1_200 + 1_500
    assert browser_problems(driver) == []


def test_a_pool_s_learned_state_is_shown_field_by_field(console_server: ServerProcess,
                                                       browser: Any) -> None:
    """`learned` as SPEC §4.5 describes it (put into the page's answers, so that
    the check holds whichever shape this server sends): every field is shown, a
    pause is flagged in the table, and a nested hint is shown as text."""
    driver = browser
    pool = unique_name("paused")
    with console_server.client() as c:
        resp = c.put(f"/v1/pools/{pool}", json={"limit": 8, "rpm": 600})
        assert resp.status_code == 201, resp.text
    open_console(driver, console_server, console_server.admin_key, view="pools")
    signed_in(driver)
    driver.execute_script(
        """
        const real = window.fetch;
        window.fetch = async (input, init) => {
          const response = await real(input, init);
          if (!/v1\\/pools[\\/?]/.test(String(input)) || !response.ok) return response;
          const body = await response.json();
          const learn = (p) => { p.learned = {
            effective_limit: 3, effective_rpm: 120, window_ms: 60000,
            paused_until_at: "2026-12-01T08:00:00.000Z",
            last_hint: {source: "<i>retry-after</i>", retry_after_ms: 1500,
                        at: "2026-12-01T07:59:58.500Z"}}; };
          if (Array.isArray(body.pools)) body.pools.forEach(learn); else learn(body);
          return new Response(JSON.stringify(body), {status: response.status,
                                                     headers: response.headers});
        };
        """)
    row = wait_for("the pause in the table", lambda: next(
        (r for r in by_css(driver, "#pools-body tr.paused") if pool in r.text), None))
    assert "2026-12-01T08:00:00.000Z" in row.text
    visible(driver, f'button[data-pool="{pool}"]').click()

    def learned_text() -> str | None:
        shown = str(driver.find_element("id", "pool-detail-learned").text)
        return shown if "window_ms" in shown else None

    learned = wait_for("the learned state", learned_text)
    for shown in ("effective_limit\n3", "effective_rpm\n120", "window_ms\n60000",
                  '"source":"<i>retry-after</i>"', '"retry_after_ms":1500'):
        assert shown in learned, (shown, learned)
    assert by_css(driver, "main i") == []
    assert browser_problems(driver) == []


def test_a_shared_lock_shows_its_holders_and_a_force_release_ends_them_all(
        console_server: ServerProcess, browser: Any) -> None:
    driver = browser
    name = unique_name("readers")
    with console_server.client() as c:
        for operation in ("report", "backup"):
            resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(),
                         json={"ttl_seconds": 60, "operation": operation, "mode": "shared"})
            assert resp.status_code == 201, resp.text
    open_console(driver, console_server, console_server.admin_key)
    signed_in(driver)
    row = visible(driver, f'tr[data-lock="{name}"]')
    assert "(shared, +1)" in row.text, row.text
    visible(driver, f'button[data-lock="{name}"]').click()
    wait_for("the mode and holder count", lambda: "shared" in driver.find_element(
        "id", "lock-detail-facts").text and "Holders\n2" in driver.find_element(
        "id", "lock-detail-facts").text)
    visible(driver, f'button[data-force-release="{name}"]').click()
    dialog = visible(driver, "dialog#confirm")
    assert "1 other shared lease" in dialog.text, dialog.text
    driver.find_element("id", "confirm-ok").click()
    assert "2 leases ended" in visible(driver, "#notice").text
    with console_server.client() as c:
        assert c.get(f"/v1/locks/{name}").json()["held"] is False
    assert browser_problems(driver) == []
