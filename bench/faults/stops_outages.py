"""The first round of the fault table (`bench/faults/run.py` runs it): bad input tried as a new user
would, through the `pvpo` CLI, each fault checked for its outcome (rc 2 and a one-line message
naming the file/line, or the warning) and for the user's files it must not lose; stops of
training and evaluation, retriever outages, a frozen server and hostile clients."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.faults.probes import (
    ENV,
    REPO,
    SMOKE,
    Probes,
    Row,
    first_error,
    free_port,
    interruptible,
    jsonl,
    pvpo,
    run_probes,
    snapshot,
    stop,
)
from bench.retriever.load import SMALL_QUERIES, Tally, closed_loop_client, rss_mb, serve_index


class StopsOutages(Probes):
    """The first round's probes; each returns a table row."""

    # ---- setup --------------------------------------------------------------------------------
    def smoke_run(self) -> Row:
        res = pvpo("train", "--config", SMOKE, "--run-dir", str(self.base))
        rows = [json.loads(x) for x in (self.base / "metrics.jsonl").read_text().splitlines()] if res.rc == 0 else []
        grad = max((r.get("grad_norm", 0.0) for r in rows), default=0.0)
        ok = res.rc == 0 and grad > 0
        return Row(
            "`configs/smoke.yaml` (what CI's end-to-end checks train)",
            f"rc {res.rc}, {len(rows)} steps, max grad_norm {grad:.4f}, {res.seconds:.0f} s",
            ok,
        )

    # ---- bad data, configs and checkpoints -------------------------------------------------------
    def overwrite_bad_source(self) -> Row:
        run = self.copy_run("overwrite")
        before = snapshot(run)
        res = pvpo("train", "--config", SMOKE, "--run-dir", str(run), "--overwrite", "data.source=/nonexistent.jsonl")
        kept = snapshot(run) == before
        return Row(
            "`pvpo train --overwrite` with a bad `data.source`",
            f"rc {res.rc}: {first_error(res.out)}; {len(before)} files before, "
            + ("all kept byte for byte" if kept else f"{len(snapshot(run))} after"),
            res.rc == 2 and kept,
        )

    def eval_refused(self, fault: str, name: str, data: bytes, expect: str) -> Row:
        path = self.dataset(name, data)
        res = pvpo(*self.eval_args(path, f"eval_{path.stem}"))
        msg = first_error(res.out)
        return Row(fault, f"rc {res.rc}: {msg}", res.rc == 2 and expect in msg and "Traceback" not in res.out)

    def huge_question(self) -> Row:
        q = "why " * 250_000  # 1 MB
        rows = [
            {"id": "1", "question": q, "golden_answers": ["a"]},
            {"id": "2", "question": "q?", "golden_answers": ["a"]},
        ]
        path = self.dataset("huge.jsonl", jsonl(rows))
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "pvpo.cli", *self.eval_args(path, "eval_huge")],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        peak = 0
        while proc.poll() is None and time.perf_counter() - t0 < 300:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak = max(peak, int(next(ln for ln in status.splitlines() if ln.startswith("VmHWM")).split()[1]))
            except (OSError, StopIteration):
                pass
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate()[0]
        warn = next((ln for ln in out.splitlines() if "were cut" in ln), "no warning")
        return Row(
            "a 1 MB question in an eval dataset",
            f"rc {proc.returncode} in {time.perf_counter() - t0:.0f} s, peak RSS {peak / 1024:.0f} MB; {warn.strip()[:120]}",
            proc.returncode == 0 and "were cut" in out,
        )

    def no_golden(self) -> Row:
        rows = [
            {"id": "1", "question": "q1?", "golden_answers": ["a"]},
            {"id": "2", "question": "q2?", "golden_answers": []},
            {"id": "3", "question": "q3?"},
        ]
        path = self.dataset("nogold.jsonl", jsonl(rows))
        res = pvpo(*self.eval_args(path, "eval_nogold"))
        warn = next((ln for ln in res.out.splitlines() if "without golden answers" in ln), "no warning")
        return Row(
            "rows with no or an empty `golden_answers`",
            f"rc {res.rc}, N={'1' if 'N=1)' in res.out else '?'}; {warn.strip()[:110]}",
            res.rc == 0 and "N=1)" in res.out and "skipped 2 of 3" in warn,
        )

    def empty_train(self) -> Row:
        path = self.dataset("empty_train.jsonl", b"")
        res = pvpo("train", "--config", SMOKE, "--run-dir", str(self.work / "empty_train"), f"data.source={path}")
        res2 = pvpo("train", "--run-dir", str(self.work / "empty_train2"), f"data.source={path}", f"data.corpus={path}")
        msg = first_error(res2.out)
        return Row(
            "an empty dataset: `pvpo train`",
            f"rc {res2.rc}: {msg}",
            res2.rc == 2 and "holds no questions" in msg and "Traceback" not in res.out + res2.out,
        )

    def yaml_error(self) -> Row:
        bad = self.dataset("bad.yaml", b"run:\n  steps: 3\nrollout: {n: 4\n")
        res = pvpo("train", "--config", str(bad), "--run-dir", str(self.work / "yaml"))
        return Row(
            "a YAML syntax error in `--config`",
            f"rc {res.rc}, {len(res.out.splitlines())} lines: {first_error(res.out)}",
            res.rc == 2 and "line 4, column 1" in res.out and "Traceback" not in res.out,
        )

    def checkpoint_fault(self, fault: str, name: str, damage: Callable[[Path], None], expect: str) -> Row:
        run = self.copy_run(name)
        damage(run)
        before = snapshot(run)
        res = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=3")
        msg = first_error(res.out)
        return Row(
            fault,
            f"rc {res.rc}: {msg}",
            res.rc == 2 and expect in res.out and snapshot(run) == before and "Traceback" not in res.out,
        )

    def corpus_fault(self) -> Row:
        rows = [{"id": "a", "contents": "one"}, {"id": "b", "contents": ""}, {"id": "a", "contents": "three"}]
        path = self.dataset("dup_corpus.jsonl", jsonl(rows))
        res = pvpo("retriever", "build", "--corpus", str(path), "--out", str(self.work / "dup_index"))
        rows2 = [{"id": "a", "contents": "one"}, {"id": "b", "contents": "  "}]
        path2 = self.dataset("empty_passage.jsonl", jsonl(rows2))
        res2 = pvpo("retriever", "build", "--corpus", str(path2), "--out", str(self.work / "empty_index"))
        warn = next((ln for ln in res2.out.splitlines() if "have no text" in ln), "no warning")
        return Row(
            "a corpus with duplicate ids and empty passages",
            f"duplicates: rc {res.rc}: {first_error(res.out)[:90]}; empty: rc {res2.rc}, {warn.strip()[:80]}",
            res.rc == 2 and "more than once" in res.out and "1 of 2 passages have no text" in warn,
        )

    # ---- the half that already held ---------------------------------------------------------------
    def sigkill_resume(self) -> Row:
        run = self.work / "killed"
        args = [sys.executable, "-m", "pvpo.cli", "train", "--config", SMOKE, "--run-dir", str(run)]
        proc = subprocess.Popen(
            args, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=interruptible
        )
        latest = run / "checkpoints" / "latest"
        t0 = time.perf_counter()
        while proc.poll() is None and not latest.exists() and time.perf_counter() - t0 < 300:
            time.sleep(0.05)
        killed = proc.poll() is None
        if killed:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        res = pvpo("train", "--run-dir", str(run), "--resume")
        a = (self.base / "metrics.jsonl").read_text().splitlines()
        b = (run / "metrics.jsonl").read_text().splitlines()
        keys = ("step", "reward/mean", "loss", "grad_norm")
        same = [{k: json.loads(x).get(k) for k in keys} for x in a] == [
            {k: json.loads(x).get(k) for k in keys} for x in b
        ]
        return Row(
            "SIGKILL in mid-training (after the first checkpoint), then `--resume`",
            f"{'killed' if killed else 'ended before the kill'}; resume rc {res.rc}; "
            f"step/reward/loss/grad_norm {'identical to' if same else 'differ from'} the unbroken run",
            killed and res.rc == 0 and same,
        )

    def unknown_key(self) -> Row:
        res = pvpo("train", "--config", SMOKE, "--run-dir", str(self.work / "unknown"), "rollout.nn=3")
        return Row(
            "unknown config key", f"rc {res.rc}: {first_error(res.out)}", res.rc == 2 and "rollout.nn" in res.out
        )

    def missing_corpus(self) -> Row:
        res = pvpo("retriever", "build", "--corpus", str(self.work / "none.jsonl"), "--out", str(self.work / "i1"))
        empty = self.dataset("empty_corpus.jsonl", b"")
        res2 = pvpo("retriever", "build", "--corpus", str(empty), "--out", str(self.work / "i2"))
        return Row(
            "missing or empty corpus",
            f"missing: rc {res.rc}: {first_error(res.out)[:70]}; empty: rc {res2.rc}: {first_error(res2.out)[:60]}",
            res.rc == 2 and res2.rc == 2,
        )

    def sigint_eval(self) -> Row:
        rows = [{"id": str(i), "question": f"who is entity {i}?", "golden_answers": ["x"]} for i in range(24)]
        path = self.dataset("sigint.jsonl", jsonl(rows))
        whole = pvpo(*self.eval_args(path, "eval_whole"), "--batch-size", "4")
        args = [sys.executable, "-m", "pvpo.cli", *self.eval_args(path, "eval_cut"), "--batch-size", "4"]
        proc = subprocess.Popen(
            args, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=interruptible
        )
        preds = self.work / "eval_cut" / "sigint" / "predictions.jsonl"
        t0 = time.perf_counter()
        while proc.poll() is None and time.perf_counter() - t0 < 300:
            if preds.exists() and len(preds.read_text().splitlines()) >= 4:
                break
            time.sleep(0.05)
        interrupted = proc.poll() is None
        if interrupted:
            proc.send_signal(signal.SIGINT)
        proc.wait()
        again = pvpo(*self.eval_args(path, "eval_cut"), "--batch-size", "4")
        same = (self.work / "eval_whole" / "sigint" / "predictions.jsonl").read_bytes() == preds.read_bytes()
        return Row(
            "SIGINT during `pvpo eval`, then the same command again",
            f"{'interrupted' if interrupted else 'ended first'}; rc {whole.rc}/{again.rc}; "
            f"predictions {'identical to' if same else 'differ from'} an uninterrupted run",
            interrupted and again.rc == 0 and same,
        )

    # ---- retriever outages during training and hostile clients -----------------------------------
    def serve(self, port: int, name: str) -> subprocess.Popen:
        """`pvpo retriever serve` over the smoke run's index on `port`, once /health answers."""
        return serve_index(self.base / "index", port, self.work / f"{name}.log")

    def train_until_setup(self, name: str, port: int, *overrides: str) -> subprocess.Popen:
        """`pvpo train` against the retriever on `port`, returned once it has written its config.yaml:
        its first searches (the GT set and the anchor, ~1-6 s later here) come next. The tiny policy
        itself never searches (searches_per_traj 0), so a fault after the first step would meet no call."""
        run = self.work / name
        args = ["train", "--config", SMOKE, "--run-dir", str(run), f"retriever.url=http://127.0.0.1:{port}"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "pvpo.cli", *args, *overrides],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        t0 = time.perf_counter()
        while proc.poll() is None and not (run / "config.yaml").exists() and time.perf_counter() - t0 < 300:
            time.sleep(0.01)
        return proc

    def retriever_down_14s(self) -> Row:
        port = free_port()
        server = self.serve(port, "down14")
        # 20 retries wait ~66 s: the 14 s outage plus the restart (~5 s to load the index on idle cores,
        # over 30 s on busy ones); the default 8 wait ~18 s, which the outage and the restart can pass
        steps = ("retriever.retries=20",)
        try:
            ref = pvpo("train", "--config", SMOKE, "--run-dir", str(self.work / "down14_ref"),
                       f"retriever.url=http://127.0.0.1:{port}", *steps)  # fmt: skip
            proc = self.train_until_setup("down14", port, *steps)
            running = proc.poll() is None
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
            t_kill = time.perf_counter()
            time.sleep(14)
            server = self.serve(port, "down14b")
            down = time.perf_counter() - t_kill
            still = proc.poll() is None
            out = proc.communicate(timeout=600)[0]
        finally:
            stop(server, *([proc] if "proc" in locals() else []))

        def deterministic(run: str) -> list[dict[str, object]]:
            rows = [json.loads(x) for x in (self.work / run / "metrics.jsonl").read_text().splitlines()]
            return [
                {k: v for k, v in r.items() if not (k.startswith(("time/", "mem/")) or "_s_per" in k)} for r in rows
            ]

        same = ref.rc == 0 and proc.returncode == 0 and deterministic("down14_ref") == deterministic("down14")
        return Row(
            "retriever down for 14 s during `pvpo train` (SIGKILL, restarted on the same port 14 s later); "
            "retriever.retries=20",
            f"{'killed mid-run' if running else 'training ended first'}; back after {down:.0f} s"
            f"{', training still running' if still else ''}; {out.count('retriever attempt')} failed attempts "
            f"retried; rc {proc.returncode}{'' if 'Traceback' not in out else ' (traceback)'}; metrics minus time/*, mem/* "
            f"{'identical to' if same else 'differ from'} an unbroken run (rc {ref.rc})",
            running and still and proc.returncode == 0 and same,
        )

    def retriever_gone(self) -> Row:
        port = free_port()
        server = self.serve(port, "down40")
        try:
            proc = self.train_until_setup("down40", port)  # the default retry budget (~18 s)
            running = proc.poll() is None
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
            t_kill = time.perf_counter()
            out = proc.communicate(timeout=600)[0]
            took = time.perf_counter() - t_kill
        finally:
            stop(server, *([proc] if "proc" in locals() else []))
        return Row(
            "retriever down for good during `pvpo train` (SIGKILL, no restart), default retries",
            f"{'killed mid-run' if running else 'training ended first'}; rc {proc.returncode} {took:.0f} s "
            f"after the kill: {first_error(out)[:110]}",
            running and proc.returncode == 2 and "Traceback" not in out and took < 60,
        )

    def server_frozen(self) -> Row:
        port = free_port()
        server = self.serve(port, "frozen")
        budget = ("retriever.timeout=3", "retriever.retries=2", "retriever.max_backoff=1")
        try:
            proc = self.train_until_setup("frozen", port, *budget)
            running = proc.poll() is None
            os.kill(server.pid, signal.SIGSTOP)
            t_stop = time.perf_counter()
            try:
                out = proc.communicate(timeout=120)[0]
            except subprocess.TimeoutExpired:
                proc.kill()
                out = proc.communicate()[0]
            took = time.perf_counter() - t_stop
        finally:
            if server.poll() is None:
                os.kill(server.pid, signal.SIGCONT)
            stop(server, *([proc] if "proc" in locals() else []))
        return Row(
            "server frozen during `pvpo train` (SIGSTOP, never resumed); retriever.timeout=3, retries=2, max_backoff=1",
            f"{'frozen mid-run' if running else 'training ended first'}; rc {proc.returncode} {took:.0f} s "
            f"after the freeze: {first_error(out)[:110]}",
            running and proc.returncode == 2 and "Traceback" not in out and took < 60,
        )

    def hostile_clients(self, server: subprocess.Popen) -> Row:
        import asyncio

        port = int(self.url.rsplit(":", 1)[1])
        head = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
        bad: list[tuple[str, bytes, int]] = [
            ("slowloris", head % (b"application/json", 100) + b'{"queries": ', 408)
        ] * 64
        bad += [("oversized", head % (b"application/json", 10**9), 413)] * 16
        bad += [("text/plain", head % (b"text/plain", 15) + b'{"queries": 1}', 415)] * 16
        wrong = b'{"queries": [1, 2], "topk": "many"}'
        bad += [("wrong types", head % (b"application/json", len(wrong)) + wrong, 422)] * 16
        bad += [("not UTF-8", head % (b"application/json", 18) + b'{"queries": ["\xff"]}', 422)] * 16
        small = [(json.dumps({"queries": [q], "topk": 2}).encode(), 1) for q in SMALL_QUERIES]

        async def hostile(req: bytes) -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(req)
                return int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 60)).split()[1])
            except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                return 0
            finally:
                writer.close()

        async def attack() -> tuple[list[int], Tally]:
            valid = Tally()
            bad_tasks = asyncio.gather(*(hostile(req) for _, req, _ in bad))
            # valid clients keep asking until every hostile one got its answer (the slowloris ones: the body timeout)
            stop_at = time.monotonic() + 600
            valid_tasks = [
                asyncio.create_task(closed_loop_client(port, small, stop_at, valid, 30.0)) for _ in range(16)
            ]
            statuses = await bad_tasks
            for t in valid_tasks:
                t.cancel()
            await asyncio.gather(*valid_tasks, return_exceptions=True)
            return list(statuses), valid

        rss0 = rss_mb(server.pid)
        t0 = time.perf_counter()
        statuses, valid = asyncio.run(attack())
        took = time.perf_counter() - t0
        rss1 = rss_mb(server.pid)
        got: dict[str, dict[int, int]] = {}
        for (name, _, _), st in zip(bad, statuses, strict=True):
            got.setdefault(name, {}).setdefault(st, 0)
            got[name][st] += 1
        as_due = all(st == due for (_, _, due), st in zip(bad, statuses, strict=True))
        seen = "; ".join(f"{n} " + ", ".join(f"{c}×{s}" for s, c in sorted(d.items())) for n, d in got.items())
        return Row(
            f"{len(bad)} hostile clients (slowloris, oversized body, wrong content type, wrong types, non-UTF-8) "
            "mixed with 16 valid ones",
            f"{len(valid.latencies)} valid requests, {valid.errors} errors; {seen}; {took:.0f} s; "
            f"RSS {rss0:.0f} → {rss1:.0f} MB",
            as_due and valid.errors == 0 and len(valid.latencies) > 0,
        )

    def held_rows(self, server: subprocess.Popen) -> list[Row]:
        """Stops, bad keys and hostile clients (the loopback retriever `server` up)."""
        return run_probes(
            [
                self.sigkill_resume,
                self.sigint_eval,
                self.unknown_key,
                self.missing_corpus,
                lambda: self.hostile_clients(server),
            ]
        )

    def outage_rows(self) -> list[Row]:
        """The retriever outages during training (each starts and kills its own server)."""
        return run_probes([self.retriever_down_14s, self.retriever_gone, self.server_frozen])

    def data_rows(self) -> list[Row]:
        """Bad data, configs and checkpoints."""
        ok_row = b'{"id": "1", "question": "q1?", "golden_answers": ["a"]}\n'
        trainer_state = ("checkpoints", "step_000002", "trainer_state.pt")
        return run_probes(
            [
                self.overwrite_bad_source,
                self.huge_question,
                lambda: self.eval_refused(
                    "malformed JSON on line 2 of a dataset",
                    "bad_json.jsonl",
                    ok_row + b'{"id": "2", "question": "unterminated\n',
                    "bad_json.jsonl: line 2",
                ),
                lambda: self.eval_refused(
                    "a non-UTF-8 dataset",
                    "latin1.jsonl",
                    ok_row + b'{"id": "2", "question": "\xff"}\n',
                    "latin1.jsonl: line 2",
                ),
                lambda: self.eval_refused(
                    "an empty dataset: `pvpo eval`", "empty.jsonl", b"", "empty.jsonl holds no questions"
                ),
                self.empty_train,
                self.no_golden,
                self.yaml_error,
                lambda: self.checkpoint_fault(
                    "`checkpoints/latest` naming a step that is gone",
                    "gone",
                    lambda r: shutil.rmtree(r / "checkpoints" / "step_000002"),
                    "which is gone",
                ),
                lambda: self.checkpoint_fault(
                    "a truncated `trainer_state.pt`",
                    "truncated",
                    lambda r: r.joinpath(*trainer_state).write_bytes(r.joinpath(*trainer_state).read_bytes()[:1000]),
                    "is damaged",
                ),
                lambda: self.checkpoint_fault(
                    "a `latest` pointing outside the run folder",
                    "outside",
                    lambda r: (r / "checkpoints" / "latest").write_text("../../elsewhere"),
                    "refusing to load it",
                ),
                self.corpus_fault,
            ]
        )
