"""The docs site builds strictly, the README's links hold, and the built site works in a real
browser.

`mkdocs build --strict` fails on a broken link or anchor, a page missing from
the nav and an API object that no longer exists. The browser test opens the
built site in headless Chromium (Debian's `chromium`), driven over the
DevTools protocol on a pipe (`--remote-debugging-pipe`: no extra Python
package), and saves a screenshot of each page it checks into
$LOADERX_ARTIFACTS (default: the test's temporary directory).
"""

from __future__ import annotations

import base64
import functools
import http.server
import importlib.util
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_SECONDS = 300
BROWSER_WAIT_SECONDS = 30  # per page: load, render, and (search) the index built in a worker
MESSAGES_MAX = 10_000  # DevTools events read while waiting for one reply


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with `mkdocs build --strict` into a temporary directory."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None or (
            "." in module and importlib.util.find_spec(module) is None
        ):
            pytest.skip(
                f"the docs build needs {module}: pip install -c .ci/constraints.txt -e '.[docs]'"
            )
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    )
    return target


def test_strict_build_has_every_page_and_api_object(site):
    """The strict build succeeds and holds the required pages, the API reference of DataLoader among
    them."""
    for page in (
        "index.html",
        "getting-started/dense/index.html",
        "getting-started/tokens/index.html",
        "getting-started/arrays/index.html",
        "guides/migration/index.html",
        "troubleshooting/index.html",
        "architecture/index.html",
        "concepts/guarantees/index.html",
        "benchmarks/index.html",
        "search/search_index.json",
    ):
        assert (site / page).is_file(), page
    api = (site / "reference/dataloader/index.html").read_text()
    assert 'id="loaderx.DataLoader.state_dict"' in api  # generated from the docstrings


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a plain heading."""
    text = re.sub(r"[`*]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    headings, fence = [], False
    for line in page.read_text().split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"^#{1,6} ", line):
            headings.append(slug(line.lstrip("#").strip()))
    return set(headings)


def test_readme_links_point_at_pages_and_headings_that_exist():
    """Every relative link of README.md names an existing file, and its #anchor an existing heading
    there."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", readme)
    assert len(links) >= 20
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {path}, which does not exist"
        if anchor:
            assert anchor in anchors(target), f"README links to {link}: no such heading"


def test_readme_stays_short():
    """README.md stays a five-minute read (at most 250 lines) and its quick start at most 15
    lines."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split("\n")) <= 250
    quick_start = readme.split("## Quick start", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(quick_start.strip("\n").split("\n")) <= 15


# ---- the browser ------------------------------------------------------------------------------


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4 of the child)."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_child_read, self._to_child = os.pipe()
        self._from_child, from_child_write = os.pipe()

        def wire_pipes() -> None:  # runs in the child: Chromium reads fd 3 and writes fd 4
            # Through high numbers first, in case a pipe end already is fd 3 or 4.
            os.dup2(to_child_read, 100)
            os.dup2(from_child_write, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)

        self._process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire_pipes,
            pass_fds=(3, 4),  # kept open: close_fds runs after preexec_fn
        )
        os.close(to_child_read)
        os.close(from_child_write)
        self._buffer = b""
        self._next_id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )

    def call(
        self,
        method: str,
        params: dict,
        session: bool = False,
        timeout: float = BROWSER_WAIT_SECONDS,
    ) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        for _ in range(MESSAGES_MAX):
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]
        raise AssertionError(f"{method}: no reply among {MESSAGES_MAX} messages")

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "Chromium did not answer in time"
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                assert chunk, "Chromium closed its DevTools pipe (it exited)"
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str):
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )
        return result["result"].get("value")

    def open_until(self, url: str, condition: str) -> None:
        """Navigate, then poll the JavaScript `condition` until it holds (bounded)."""
        self.call("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + BROWSER_WAIT_SECONDS
        while time.monotonic() < deadline:
            if self.evaluate(f"Boolean({condition})"):
                time.sleep(0.3)  # let fonts and the last layout settle before the screenshot
                return
            time.sleep(0.1)
        raise AssertionError(
            f"{url}: `{condition}` never held; the page shows: "
            f"{self.evaluate('document.body ? document.body.innerText.slice(0, 500) : null')!r}"
        )

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        os.close(self._to_child)
        os.close(self._from_child)
        self._process.kill()
        self._process.wait(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


NAV = (
    "document.querySelector('nav.md-nav--primary')"
    " && document.querySelectorAll('nav.md-nav--primary a').length > 20"
)
PAGES = [
    # (screenshot name, path, what must hold once rendered)
    ("home", "", NAV + " && document.querySelector('h1').textContent.includes('loaderx')"),
    (
        "api-dataloader",
        "reference/dataloader/",
        NAV + " && document.getElementById('loaderx.DataLoader')"
        " && document.getElementById('loaderx.DataLoader.load_state_dict')"
        " && document.querySelector('.md-nav__link--active').textContent.trim() === 'DataLoader'",
    ),
    (
        "guide-dataloader",
        "guides/dataloader/",
        NAV + " && document.querySelector('h1').textContent.includes('The DataLoader')"
        " && document.querySelector('.md-nav__link--active').textContent.trim()"
        " === 'The DataLoader'",
    ),
    (
        "search-arraystore",
        "?q=ArrayStore",
        "[...document.querySelectorAll('.md-search-result__item')]"
        ".some(item => item.textContent.includes('ArrayStore'))",
    ),
]


def test_site_renders_and_searches_in_chromium(site, tmp_path):
    """Home, the DataLoader API reference and the DataLoader guide render with their navigation, and
    search finds ArrayStore, in headless Chromium; a screenshot of each is saved and its path
    printed."""
    binary = chromium_binary()
    if binary is None:
        pytest.skip(
            "no chromium binary: install Debian's chromium "
            "(apt-get install chromium, as .ci/run does)"
        )
    artifacts = Path(os.environ.get("LOADERX_ARTIFACTS", tmp_path / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    browser = Browser(binary, tmp_path / "profile")
    try:
        for name, path, condition in PAGES:
            browser.open_until(f"http://127.0.0.1:{server.server_address[1]}/{path}", condition)
            shot = artifacts / f"docs-{name}.png"
            browser.screenshot(shot)
            assert shot.stat().st_size > 10_000, shot  # a rendered page, not an empty image
            print(f"screenshot: {shot}")
    finally:
        browser.close()
        server.shutdown()
        thread.join(timeout=10)


def test_troubleshooting_names_every_exception_class():
    """Every public exception class defined in src/loaderx has its entry in
    docs/troubleshooting.md."""
    import ast

    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    import loaderx

    classes = []
    for module in sorted((ROOT / "src" / "loaderx").glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and not node.name.startswith("_")
                and node.name.endswith(("Error", "Exception"))
                # An internal module's class is public once loaderx exports it;
                # until then its callers turn it into one of theirs.
                and (not module.name.startswith("_") or node.name in loaderx.__all__)
            ):
                classes.append(node.name)
    assert len(classes) >= 18
    missing = [name for name in classes if f"`{name}`" not in page]
    assert not missing, f"docs/troubleshooting.md does not explain {missing}"
