"""The viewer's probes of the fourth round of the fault table (`bench/faults/run.py --rounds 4` runs them
beside the round's other probes): `pvpo view --serve` asked for another host (DNS rebinding) or
started on a busy port; damaged lines (a predictions row whose `output` is a string, a line
`[1, 2]`, a metrics or episodes line `5`); a YAML alias bomb in a run's config; a 6.6 MB response
of one search repeated.

Each probe runs the `pvpo` CLI as a user would, on files it writes itself (no smoke run needed),
and checks the exit status, the message (one line naming the file, no traceback) or the page.
Run alone: `python bench/faults/viewer.py`.
"""

from __future__ import annotations

import http.client
import shutil
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.faults.probes import (
    Probes,
    Row,
    first_error,
    free_port,
    jsonl,
    one_line,
    popen,
    print_alone,
    pvpo,
    run_probes,
    stop,
)

LOOPING = "<think> search again </think>\n<search> the same query </search>\n" * 103_000  # 6.6 MB


def _item(ident: str, response: str = "<answer> x </answer>") -> dict:
    return {"id": ident, "question": f"{ident}?", "golden_answers": ["x"], "output": {"final_response": response}}


def _get(port: int, host: str) -> int:
    """The status of `GET /` on 127.0.0.1:`port` sent with the Host header `host`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/", headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


class ViewerInput(Probes):
    """The viewer's probes (its server, its bad input); each returns a table row."""

    def evaluation(self, name: str, rows: list[dict] | bytes) -> Path:
        """An evaluation folder `work/views/<name>` whose toy/predictions.jsonl holds `rows`."""
        folder = self.work / "views" / name
        (folder / "toy").mkdir(parents=True, exist_ok=True)
        (folder / "toy" / "predictions.jsonl").write_bytes(rows if isinstance(rows, bytes) else jsonl(rows))
        return folder

    def run_dir(self, name: str, config: str = "env:\n  protocol: search_r1\n") -> Path:
        """A run dir `work/views/<name>` with one step of one kept episode."""
        run = self.work / "views" / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(config)
        (run / "metrics.jsonl").write_bytes(jsonl([{"step": 1, "reward/mean": 0.5}]))
        episode = {"uid": "toy/q1", "question": "Q?", "golden_answers": ["x"], "response": "<answer> x </answer>"}
        (run / "episodes.jsonl").write_bytes(jsonl([{"step": 1, "rows": [], "episodes": [episode]}]))
        return run

    def page(self, name: str) -> Path:
        return self.work / "views" / f"{name}.html"

    # ---- --serve ------------------------------------------------------------------------------------
    def serve_asked_for_another_host(self) -> Row:
        folder = self.evaluation("served", [_item("q1")])
        port = free_port()
        proc = popen("view", str(folder), "--serve", "--port", str(port))
        try:
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    local = _get(port, f"127.0.0.1:{port}")
                    break
                except OSError:
                    time.sleep(0.2)
            else:
                return Row(
                    "`view --serve` asked for another host", f"the server did not start (rc {proc.poll()})", False
                )
            foreign = {
                host: _get(port, host) for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example")
            }
            tunnel = _get(port, "localhost:9000")
        finally:
            stop(proc)
        return Row(
            "`view --serve` asked for another host (a DNS-rebinding page's request)",
            f"127.0.0.1:{port} {local}, localhost:9000 (a tunnel) {tunnel}; "
            + ", ".join(f"{h} {s}" for h, s in foreign.items()),
            local == 200 and tunnel == 200 and all(s == 403 for s in foreign.values()),
        )

    def serve_on_a_busy_port(self) -> Row:
        import socket

        folder = self.evaluation("busy", [_item("q1")])
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            res = pvpo("view", str(folder), "--serve", "--port", str(port), timeout=120)
        return Row(
            "`view --serve --port P` with P taken by another program",
            f"rc {res.rc}: {first_error(res.out)}",
            one_line(res.out, res.rc, f"--port {port}: another program listens"),
        )

    # ---- bad input ----------------------------------------------------------------------------------
    def damaged_lines(self) -> Row:
        cases = {
            "a predictions row whose `output` is a string": (
                "predictions",
                b'{"id": "1", "question": "Q?", "output": "oops"}\n',
                "line 1: `output` is a JSON str",
            ),
            "a predictions line `[1, 2]`": (
                "predictions",
                jsonl([_item("1")]) + b"[1, 2]\n",
                "line 2: expected a JSON object",
            ),
            "a metrics line `5`": ("metrics", b"5\n", "metrics.jsonl:1: expected a JSON object"),
            "an episodes line `5`": ("episodes", b"5\n", "episodes.jsonl:1: expected a JSON object"),
        }
        seen, ok = [], True
        for i, (what, (file, data, expect)) in enumerate(cases.items()):
            if file == "predictions":
                target = self.evaluation(f"damaged{i}", data)
            else:
                target = self.run_dir(f"damaged{i}")
                (target / f"{file}.jsonl").write_bytes(data)
            res = pvpo("view", str(target), "--out", str(self.page(f"damaged{i}")), timeout=120)
            held = one_line(res.out, res.rc, expect)
            ok &= held
            seen.append(f"{what}: rc {res.rc}{'' if held else ' ' + first_error(res.out)[:60]}")
        return Row("`view` on damaged lines (" + ", ".join(cases) + ")", "; ".join(seen), ok)

    def alias_bomb_in_a_runs_config(self) -> Row:
        levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
        run = self.run_dir("bomb", "\n".join(levels) + "\nenv:\n  protocol: *a8\n")
        out = self.page("bomb")
        res = pvpo("view", str(run), "--out", str(out), timeout=60)
        return Row(
            "`view RUN` whose config.yaml is a YAML alias bomb (387 million values expanded) under env.protocol",
            f"rc {res.rc} in {res.seconds:.1f} s, page {'written' if out.is_file() else 'absent'}",
            res.rc == 0 and out.is_file() and res.seconds < 60,
        )

    def response_of_megabytes(self) -> Row:
        looping = LOOPING + "\n\n<information>Doc 1(Title: x) x</information>\n\n<answer> x </answer>"
        folder = self.evaluation("looping", [_item("q1", looping)])
        out = self.page("looping")
        res = pvpo("view", str(folder), "--out", str(out), timeout=60)
        return Row(
            f"`view` of a {len(looping) / 1e6:.1f} MB response repeating one search",
            f"rc {res.rc} in {res.seconds:.1f} s, page {out.stat().st_size / 1e6:.1f} MB"
            if out.is_file()
            else f"rc {res.rc}",
            res.rc == 0 and out.is_file() and res.seconds < 60,
        )

    def rows(self) -> list[Row]:
        """Every probe of this module, in the table's order."""
        return run_probes(
            [
                self.serve_asked_for_another_host,
                self.serve_on_a_busy_port,
                self.damaged_lines,
                self.alias_bomb_in_a_runs_config,
                self.response_of_megabytes,
            ]
        )


def main() -> None:
    """These probes alone, their table printed; exit 1 if one fails."""
    work = Path(tempfile.mkdtemp(prefix="pvpo-faults-viewer-"))
    try:
        rows = ViewerInput(work).rows()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_alone(rows, work)


if __name__ == "__main__":
    main()
