"""Test helpers for `pvpo view`: evaluation folders written by `run_eval` from scripted turns run
through the env's own episode rules, and headless Chromium reading the page's DOM."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import Episode, EpisodeConfig
from pvpo.evaluation.run import EvalSettings, Outcome, item_id, run_eval
from pvpo.retriever.types import Passage, make_contents
from pvpo.viewer.headless import find_chromium, headless_command

CORPUS = [
    ("Berlin", "Berlin is the capital of Germany and its largest city."),
    ("Paris", "Paris is the capital and most populous city of France, on the Seine."),
    ("Python (programming language)", "Python is a programming language created by Guido van Rossum in 1991."),
    ("Tokyo", "Tokyo is the capital of Japan and the seat of the Japanese government."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
]


class KeywordSearcher:
    """A Searcher over `CORPUS`: passages ranked by the words they share with the query (ties in
    corpus order), ids `doc<i>`, the share of the query's words as the score."""

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        out = []
        for q in queries:
            words = set(q.lower().split())
            scored = []
            for i, (title, text) in enumerate(CORPUS):
                hits = len(words & set((title + " " + text).lower().replace(",", " ").replace(".", " ").split()))
                scored.append((-hits, i, hits / max(1, len(words))))
            scored.sort()
            out.append(
                [Passage(f"doc{i}", make_contents(*CORPUS[i]), round(score, 4)) for _, i, score in scored[: topk or 3]]
            )
        return out


@dataclass
class ScriptedPolicy:
    """An `EvalPolicy` whose turns are given per question id and run through the env's episode
    rules (`Episode`) with the searcher; a question's turns after its episode ended are unused."""

    turns: dict[str, list[str]]

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Any,
        episode: EpisodeConfig,
        settings: EvalSettings,
        *,
        seed: int,
        indices: Sequence[int] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
        on_start: Callable[[int, Any], None] | None = None,
    ) -> list[Outcome]:
        outs = []
        for i, ex in enumerate(examples):
            ep = Episode(ex, episode, episode.reward_fn())
            result = None
            for turn in self.turns[item_id(ex)]:
                query = ep.begin_step(turn)
                result = ep.finish_step(searcher.search([query], episode.topk)[0] if query is not None else None)
                if ep.done:
                    break
            if not ep.done:
                result = ep.end()
            assert result is not None
            info = result.info
            outcome = Outcome(
                prompt=ep.prompt,
                response=ep.response,
                prediction=info.get("prediction"),
                num_searches=len(ep.queries),
                num_turns=ep.turns,
                prompt_tokens=len(ep.prompt.split()),
                completion_tokens=len(ep.response.split()),
                stop_reason="answer" if ep.terminated else "max_turns",
                format_ok=bool(info.get("format_ok")),
                queries=list(ep.queries),
                passages=info.get("passages", []),
            )
            if on_done is not None:
                on_done(i, outcome)
            outs.append(outcome)
        return outs


def write_eval(out: Path, dataset: str, cases: Sequence[tuple[str, str, Sequence[str], list[str]]]) -> Path:
    """`pvpo eval`'s folder `out/<dataset>` for `cases` (id, question, golds, the agent's turns), written by
    `run_eval` with the Search-R1 template, greedy settings, `KeywordSearcher` and 3 passages a search."""
    examples = [QAExample(f"{dataset}/{i}", q, tuple(golds)) for i, q, golds, _ in cases]
    policy = ScriptedPolicy({i: list(turns) for i, _, _, turns in cases})
    meta = {"label": out.name, "dataset": dataset, "split": "test", "source": "scripted", "model": out.name}
    run_eval(policy, examples, KeywordSearcher(), EvalSettings(), out / dataset, meta=meta, show_progress=False)
    return out / dataset


# ---- headless Chromium ------------------------------------------------------------------------------
def dump_dom(page: Path, fragment: str = "", *, timeout: float = 120) -> str:
    """The DOM of `page` (opened from file://, with `#fragment`) once its script has run, as headless
    Chromium serialises it: a fresh profile, no network, no GPU."""
    exe = find_chromium()
    assert exe is not None
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory(prefix="pvpo-chromium-") as profile:
        done = subprocess.run(
            headless_command(exe, profile, "--virtual-time-budget=10000", "--dump-dom", url),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "HOME": profile},
        )
    assert done.returncode == 0 and "</html>" in done.stdout, done.stderr[-2000:]
    return done.stdout


class Browser:
    """Headless Chromium driven as a user drives it: the DevTools protocol over a pipe
    (`--remote-debugging-pipe`: our commands on its fd 3, its replies on fd 4, each a JSON message
    ended by NUL), so a test clicks, types and presses keys on the page with no package beyond the
    standard library and no port opened. One tab, `width` x `height` CSS pixels."""

    KEYS = {"Enter": 13, "Escape": 27, "ArrowDown": 40, "ArrowUp": 38, "Tab": 9, " ": 32}

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        exe = find_chromium()
        assert exe is not None
        self._profile = tempfile.TemporaryDirectory(prefix="pvpo-cdp-", ignore_cleanup_errors=True)
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()

        def fds() -> None:  # in the child: the pipe ends where --remote-debugging-pipe looks
            os.dup2(to_chrome, 103)  # out of the way first: either end may itself be fd 3 or 4
            os.dup2(from_chrome, 104)
            os.dup2(103, 3)
            os.dup2(104, 4)

        args = headless_command(exe, self._profile.name, "--remote-debugging-pipe", f"--window-size={width},{height}")
        self.proc = subprocess.Popen(
            [*args, "about:blank"],
            preexec_fn=fds,  # noqa: PLW1509 (no threads of ours run in the child before exec)
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "HOME": self._profile.name},
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self._buf = b""
        self._id = 0
        self.session = ""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        """One protocol command's result (events that arrive meanwhile are dropped)."""
        import json
        import select
        import time

        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self._write, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return dict(reply.get("result", {}))
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self._read], [], [], left)[0], f"{method}: no reply in {timeout} s"
            chunk = os.read(self._read, 1 << 20)
            assert chunk, "Chromium closed the pipe"
            self._buf += chunk

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression on the page (a thrown error fails the test)."""
        got = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        assert "exceptionDetails" not in got, got["exceptionDetails"]
        return got["result"].get("value")

    def wait(self, expression: str, timeout: float = 10) -> Any:
        """The first truthy value of `expression`, polled every 20 ms."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"still false after {timeout} s: {expression}"
            time.sleep(0.02)

    def open(self, page: Path, fragment: str = "") -> None:
        """Navigate to `page` (file://, `#fragment`) and wait for its first render."""
        import json

        url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
        # by way of a blank page: the same file with another fragment would only fire hashchange
        self.send("Page.navigate", {"url": "about:blank"})
        self.wait("location.href === 'about:blank'")
        self.send("Page.navigate", {"url": url})
        self.wait(
            f"location.href === {json.dumps(url)} && !!document.documentElement"
            " && document.documentElement.hasAttribute('data-ready-ms')"
        )

    def key(self, key: str) -> None:
        """Press and release `key` (a DOM key name: Enter, Escape, ArrowDown, ...) where the focus is."""
        code = self.KEYS[key]
        base = {
            "key": key,
            "code": "Space" if key == " " else key,
            "windowsVirtualKeyCode": code,
            "nativeVirtualKeyCode": code,
        }
        self.send("Input.dispatchKeyEvent", {"type": "rawKeyDown", **base})
        if key in ("Enter", " "):
            self.send("Input.dispatchKeyEvent", {"type": "char", "text": "\r" if key == "Enter" else " ", **base})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def type(self, text: str) -> None:
        """Type `text` where the focus is, as an input method would."""
        self.send("Input.insertText", {"text": text})

    def click(self, selector: str) -> None:
        """A left click at the middle of the first element matching `selector` (scrolled into view)."""
        import json

        box = self.eval(
            f"(function () {{ var e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); var r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        assert box is not None, f"nothing matches {selector}"
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {
                    "type": kind,
                    "x": box[0],
                    "y": box[1],
                    "button": "left",
                    "clickCount": 0 if kind == "mouseMoved" else 1,
                },
            )

    def back(self) -> None:
        """The browser's Back: the history entry before the current one."""
        history = self.send("Page.getNavigationHistory")
        entry = history["entries"][history["currentIndex"] - 1]
        self.send("Page.navigateToHistoryEntry", {"entryId": entry["id"]})

    def screenshot(self, clip: tuple[float, float, float, float] | None = None) -> bytes:
        """The viewport, or its `(x, y, width, height)` CSS pixels, as PNG bytes."""
        import base64

        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params["clip"] = dict(zip(("x", "y", "width", "height"), clip, strict=True)) | {"scale": 1}
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (AssertionError, RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)
        self._profile.cleanup()


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The text of this element and all inside it, in document order."""
        return "".join(self._text_parts())

    def _text_parts(self) -> Iterator[str]:
        # texts[k] stands before children[k]; the last text after the last child
        for k, part in enumerate(self.texts):
            yield part
            if k < len(self.children):
                yield from self.children[k]._text_parts()
        for child in self.children[len(self.texts) :]:
            yield from child._text_parts()

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()

    def select(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        """Elements under this one (itself included) with `tag`, class `cls` and the given attributes
        (`data_key="x"` for `data-key`)."""
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            n
            for n in self.walk()
            if (tag is None or n.tag == tag)
            and (cls is None or cls in n.classes())
            and all(n.attrs.get(k) == v for k, v in want.items())
        ]

    def by_id(self, ident: str) -> Node:
        [node] = self.select(id=ident)
        return node


_VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "source", "wbr", "circle", "path", "line"}


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        parent = self.stack[-1]
        while len(parent.texts) < len(parent.children):
            parent.texts.append("")
        parent.children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for k in range(len(self.stack) - 1, 0, -1):
            if self.stack[k].tag == tag:
                del self.stack[k:]
                return

    def handle_data(self, data: str) -> None:
        node = self.stack[-1]
        if len(node.texts) > len(node.children):
            node.texts[-1] += data
        else:
            while len(node.texts) < len(node.children):
                node.texts.append("")
            node.texts.append(data)


def parse_dom(html: str) -> Node:
    """`html` as a tree of `Node`s."""
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root
