"""Secrets and bad input of the fourth round of the fault table (`bench/faults/run.py --rounds 4` runs it
beside the round's ownership probes): a URL password holding `@` or `/` at `config show`, `retriever
query` and `train` (its config.yaml scanned), `pvpo --debug eval` against an endpoint answering 401,
a malformed `--url`, a retriever reply of the wrong shape, a damaged metrics.json at `eval report`,
reward parameters out of range, a model-written query holding a lone surrogate, and a server named
by its full `/retrieve` URL.

Each probe runs the `pvpo` CLI as a user would and checks the exit status, the message (one line
naming the key, file or server, no traceback) and that no password is printed or written. Run alone
(`python bench/faults/secrets_input.py`), the probes that need a retriever use a stand-in serving
`/retrieve` on loopback instead of the smoke run's index.
"""

from __future__ import annotations

import http.server
import json
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.faults.probes import SMOKE, Probes, Row, first_error, one_line, print_alone, pvpo, python, run_probes

# a reply that is JSON but no /retrieve reply (a list of strings where passages belong)
WRONG_SHAPE = {"result": [["x"]]}


@contextmanager
def _http(answer: Callable[[str, dict[str, Any]], tuple[int, Any]]) -> Iterator[str]:
    """A loopback HTTP server answering each POST with `answer(path, body)` = (status, JSON reply) and
    GET /health with 200; yields its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, reply = answer(self.path, json.loads(raw or b"{}"))
            self._send(status, reply)

        def do_GET(self) -> None:
            self._send(200, {"status": "ok"})

        def _send(self, status: int, reply: Any) -> None:
            data = json.dumps(reply).encode()  # ASCII JSON: a lone surrogate travels as the escape \ud800
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def _passages(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """A stand-in retriever: one passage per query at /retrieve, 404 elsewhere."""
    if path != "/retrieve":
        return 404, {"detail": "Not Found"}
    return 200, {
        "result": [[{"document": {"id": "1", "contents": '"T"\nParis.'}, "score": 1.0}] for _ in body["queries"]]
    }


def _chat(turns: Callable[[str], str]) -> Callable[[str, dict[str, Any]], tuple[int, Any]]:
    """A stand-in OpenAI-compatible endpoint answering each request with `turns(request as JSON)`."""

    def answer(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        text = turns(json.dumps(body))
        choice = {"index": 0, "text": text, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return 200, {"choices": [choice], "usage": {"prompt_tokens": 5, "completion_tokens": 5}}

    return answer


def _leaks(texts: dict[str, str], *secrets: str) -> list[str]:
    """The names of `texts` holding any of `secrets`."""
    return [name for name, text in texts.items() if any(s in text for s in secrets)]


def _files_text(folder: Path) -> str:
    """Every file under `folder`, decoded leniently and joined (to scan for a secret)."""
    if not folder.exists():
        return ""
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*") if p.is_file())


class SecretsInput(Probes):
    """The secrets and bad-input probes (credentials in URLs, odd replies and parameters, a lone
    surrogate, the two URL forms); each returns a table row."""

    @contextmanager
    def _retriever(self) -> Iterator[str]:
        """The smoke run's loopback retriever where the runner started one, else a stand-in."""
        if self.url:
            yield self.url
        else:
            with _http(_passages) as url:
                yield url

    # ---- no secret is echoed ---------------------------------------------------------------------
    def password_holding_an_at_sign(self) -> Row:
        url = "http://admin:Secret@4x@127.0.0.1:9"
        show = pvpo("config", "show", f"retriever.url={url}")
        query = pvpo("retriever", "query", "--url", url, "--retries", "0", "who?")
        run = self.work / "at_password"
        train = pvpo("train", "--config", SMOKE, "--run-dir", str(run), f"retriever.url={url}", "retriever.retries=0")
        written = _files_text(run)
        leaks = _leaks(
            {"show": show.out, "query": query.out, "train": train.out, "run files": written}, "4x@", "Secret"
        )
        return Row(
            "a URL password holding `@` (`admin:Secret@4x@...`) at `config show`, `retriever query` and `train` "
            "(every file of its run dir scanned)",
            f"show rc {show.rc}; query rc {query.rc}: {first_error(query.out)[:80]}; train rc {train.rc}, "
            f"config.yaml {'written' if (run / 'config.yaml').exists() else 'not written'}; leaked in: {leaks or 'none'}",
            not leaks
            and show.rc == 0
            and "url: http://admin:***@127.0.0.1:9" in show.out
            and one_line(query.out, query.rc, "admin:***@127.0.0.1:9")
            and train.rc == 2
            and ("admin:***@127.0.0.1:9" in written or not (run / "config.yaml").exists()),
        )

    def debug_traceback_of_a_401(self) -> Row:
        data = self.questions("q401.jsonl", 1)
        with _http(lambda path, body: (401, {"error": "bad key"})) as base:
            endpoint = base.replace("http://", "http://u:PW4xQ9@") + "/v1"
            res = pvpo(
                "--debug", "eval", "--engine", "openai", "--base-url", endpoint, "--model-name", "m",
                "--dataset", str(data), "--retriever-url", base, "--out", str(self.work / "eval401"), "--quiet",
            )  # fmt: skip
            plain = pvpo(
                "eval", "--engine", "openai", "--base-url", endpoint, "--model-name", "m",
                "--dataset", str(data), "--retriever-url", base, "--out", str(self.work / "eval401b"), "--quiet",
            )  # fmt: skip
        leaks = _leaks({"--debug": res.out, "plain": plain.out}, "PW4xQ9")
        return Row(
            "`pvpo --debug eval --engine openai --base-url http://u:PW@host/v1` against an endpoint answering 401 "
            "(and the same without --debug)",
            f"--debug rc {res.rc}, {'a traceback' if 'Traceback' in res.out else 'no traceback'}; plain rc {plain.rc}: "
            f"{first_error(plain.out)[:80]}; leaked in: {leaks or 'none'}",
            not leaks and res.rc == 1 and "Traceback" in res.out and "u:***@127.0.0.1" in res.out
            and one_line(plain.out, plain.rc, "HTTP 401"),
        )  # fmt: skip

    def password_holding_a_slash(self) -> Row:
        url = "http://admin:Sec/ret4x@127.0.0.1:9"
        query = pvpo("retriever", "query", "--url", url, "--retries", "0", "who?")
        show = pvpo("config", "show", f"retriever.url={url}")
        run = self.work / "slash_password"
        train = pvpo("train", "--config", SMOKE, "--run-dir", str(run), f"retriever.url={url}")
        outs = {"query": query.out, "show": show.out, "train": train.out}
        leaks = _leaks(outs, "Sec", "ret4x")
        return Row(
            "a URL password holding `/` (`admin:Sec/ret4x@...`) at `retriever query`, `config show` and `train`",
            f"query rc {query.rc}, {len(query.out.splitlines())} lines: {first_error(query.out)[:100]}; show rc "
            f"{show.rc}; train rc {train.rc}; leaked in: {leaks or 'none'}",
            not leaks
            and all(one_line(o.out, o.rc, "admin:***@127.0.0.1:9") and "%2F" in o.out for o in (query, show, train))
            and not run.exists(),
        )

    # ---- bad input: one line, never a traceback --------------------------------------------------
    def malformed_url(self) -> Row:
        query = pvpo("retriever", "query", "--url", "http://127.0.0.1:80a", "--retries", "0", "who?")
        data = self.questions("q80a.jsonl", 1)
        evaluate = pvpo(
            "eval", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model-name", "m", "--dataset",
            str(data), "--retriever-url", "http://127.0.0.1:80a", "--out", str(self.work / "eval80a"),
        )  # fmt: skip
        return Row(
            "a malformed `--url http://127.0.0.1:80a` at `retriever query`; the same `--retriever-url` at `eval`",
            f"query rc {query.rc}: {first_error(query.out)[:90]}; eval rc {evaluate.rc}: {first_error(evaluate.out)[:60]}",
            one_line(query.out, query.rc, "--url 'http://127.0.0.1:80a'")
            and one_line(evaluate.out, evaluate.rc, "--retriever-url 'http://127.0.0.1:80a'")
            and not (self.work / "eval80a").exists(),
        )

    def reply_of_the_wrong_shape(self) -> Row:
        with _http(lambda path, body: (200, WRONG_SHAPE)) as base:
            res = pvpo("retriever", "query", "--url", base, "--retries", "0", "who?")
        return Row(
            'a retriever replying `{"result": [["x"]]}` at `retriever query`',
            f"rc {res.rc}: {first_error(res.out)[:130]}",
            one_line(res.out, res.rc, f"{base}/retrieve: malformed reply: result[0][0] is str"),
        )

    def damaged_metrics(self) -> Row:
        cut, listed = self.work / "report_cut" / "nq", self.work / "report_list" / "nq"
        for folder in (cut, listed):
            folder.mkdir(parents=True, exist_ok=True)
        (cut / "metrics.json").write_text('{"em": 0.5, "n": 10, "lab')
        (listed / "metrics.json").write_text("[0.5, 10]")
        a = pvpo("eval", "report", str(cut.parent))
        b = pvpo("eval", "report", str(listed.parent))
        return Row(
            "`eval report` on a cut metrics.json; on one holding a JSON list",
            f"cut: rc {a.rc}: {first_error(a.out)[:90]}; list: rc {b.rc}: {first_error(b.out)[:90]}",
            one_line(a.out, a.rc, f"{cut / 'metrics.json'}: damaged")
            and one_line(b.out, b.rc, f"{listed / 'metrics.json'}: a JSON list"),
        )

    def reward_params_out_of_range(self) -> Row:
        outs = {}
        for value in (".nan", "5"):
            run = self.work / f"floor_{value.strip('.')}"
            outs[value] = (
                pvpo("train", "--config", SMOKE, "--run-dir", str(run), f"algorithm.reward_params.floor={value}"),
                run,
            )
        code = (
            "import gymnasium, pvpo.envs\n"
            "try:\n"
            "    gymnasium.make('pvpo/SearchQA-v0', reward_params={'floor': 5.0}, retriever_url='http://127.0.0.1:9')\n"
            "    print('accepted')\n"
            "except ValueError as e:\n"
            "    print('refused:', e)\n"
        )
        gym = python(code)
        said = next((ln for ln in gym.out.splitlines() if ln.startswith(("refused", "accepted"))), gym.out[-100:])
        return Row(
            "reward parameters `algorithm.reward_params.floor=.nan` and `=5` at `train`; `floor=5.0` at `gymnasium.make`",
            "; ".join(f"{v}: rc {o.rc}: {first_error(o.out)[-60:]}" for v, (o, _) in outs.items()) + f"; gym: {said[:70]}",
            all(one_line(o.out, o.rc, "parameter 'floor' must be a number in [0, 1]") and not run.exists()
                for o, run in outs.values())
            and said.startswith("refused") and "'floor'" in said,
        )  # fmt: skip

    def staleness_that_cannot_run(self) -> Row:
        """`rollout.max_staleness` true / on / 10^5 / 10^12, and v05 ahead of the update: each refused
        when the config loads, in one line naming the key, before a file of the run is written."""
        cases = {
            "true": ["rollout.max_staleness=true"],
            "on": ["rollout.max_staleness=on"],
            "10^5": ["rollout.max_staleness=100000"],
            "10^12": ["rollout.max_staleness=1000000000000"],
            "v05 at 1": ["algorithm.estimator=v05", "rollout.max_staleness=1"],
        }
        outs = {}
        for name, overrides in cases.items():
            run = self.work / f"staleness_{name.replace('^', '').replace(' ', '_')}"
            outs[name] = (pvpo("train", "--config", SMOKE, "--run-dir", str(run), *overrides), run)
        return Row(
            "`rollout.max_staleness=true` / `on` / `100000` / `1000000000000`, and `algorithm.estimator=v05` at "
            "`rollout.max_staleness=1`, at `train`",
            "; ".join(f"{n}: rc {o.rc}{', run dir written' if run.exists() else ''}" for n, (o, run) in outs.items()),
            all(one_line(o.out, o.rc, "rollout.max_staleness") and not run.exists() for o, run in outs.values()),
        )

    def lone_surrogate_in_a_query(self) -> Row:
        def turns(body: str) -> str:
            return "<answer> Paris </answer>" if "Doc 1" in body else "<search> who \ud800 is </search>"

        data = self.questions("surrogate.jsonl", 2)
        out = self.work / "eval_surrogate"
        with self._retriever() as retriever, _http(_chat(turns)) as endpoint:
            res = pvpo(
                "eval", "--engine", "openai", "--base-url", endpoint + "/v1", "--model-name", "m", "--dataset",
                str(data), "--retriever-url", retriever, "--out", str(out), "--quiet",
            )  # fmt: skip
        preds = out / "surrogate" / "predictions.jsonl"
        rows = [json.loads(x) for x in preds.read_text().splitlines()] if preds.exists() else []
        queries = sorted({q for r in rows for q in r["output"].get("queries", [])})
        return Row(
            "a model-written `<search>` query holding a lone surrogate (`\\ud800`) at `pvpo eval` (stand-in endpoint)",
            f"rc {res.rc}, {len(rows)} answers saved, queries searched: {[ascii(q) for q in queries]}"
            + ("" if res.rc == 0 else f": {first_error(res.out)[:80]}"),
            res.rc == 0 and len(rows) == 2 and all("\ud800" not in q for q in queries),
        )

    def full_retrieve_url(self) -> Row:
        with self._retriever() as base:
            query = pvpo("retriever", "query", "--url", base + "/retrieve", "--retries", "0", "Paris")
            code = (
                "from pvpo.retriever.client import RetrieverClient\n"
                f"with RetrieverClient({base + '/retrieve'!r}, retries=0) as c:\n"
                "    print('passages', len(c.search(['Paris'])[0]), 'health', c.health())\n"
            )
            client = python(code)
        said = next((ln for ln in client.out.splitlines() if ln.startswith("passages")), client.out.strip()[-100:])
        return Row(
            "the retriever named by its full URL (`http://host:port/retrieve`, Search-R1's and verl's config form) "
            "at `retriever query` and `RetrieverClient`",
            f"query rc {query.rc}: {query.out.strip().splitlines()[0][:60] if query.out.strip() else ''}; client: {said[:60]}",
            query.rc == 0 and "# Paris" in query.out and said.startswith("passages") and said.endswith("health True"),
        )

    def rows(self) -> list[Row]:
        """Every probe of this module, in the table's order."""
        return run_probes(
            [
                self.password_holding_an_at_sign,
                self.debug_traceback_of_a_401,
                self.password_holding_a_slash,
                self.malformed_url,
                self.reply_of_the_wrong_shape,
                self.damaged_metrics,
                self.reward_params_out_of_range,
                self.staleness_that_cannot_run,
                self.lone_surrogate_in_a_query,
                self.full_retrieve_url,
            ]
        )


def main() -> None:
    """These probes alone, with a stand-in retriever, their table printed; exit 1 if one fails."""
    work = Path(tempfile.mkdtemp(prefix="pvpo-faults-secrets-"))
    try:
        rows = SecretsInput(work).rows()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_alone(rows, work)


if __name__ == "__main__":
    main()
