"""The second round of the fault table (`bench/faults/run.py` runs it): two processes on one folder,
a full or read-only disk, damaged files, stop signals, and the causes a message names. Each probe
runs the `pvpo` CLI as a user would, on the smoke run's checkpoints, policy and index, and checks
the exit status, the message (one line, naming the file or the PID, no traceback) and the files
left behind.

The full-disk and read-only probes mount a small tmpfs, which needs root; elsewhere their rows say
"not run" and count neither as passes nor as failures (the tests fault-inject the same writes:
tests/test_trainer_faults.py, tests/test_model_catalog.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.faults.probes import (
    ENV,
    REPO,
    Probes,
    Row,
    error_block,
    first_error,
    free_port,
    jsonl,
    lines_of,
    not_run,
    one_line,
    popen,
    pvpo,
    run_probes,
    steps,
    tmpfs,
    wait_for,
)


class ConcurrencyDisk(Probes):
    """The second round's probes; each returns a table row."""

    # ---- two processes -------------------------------------------------------------------------
    # enough questions that the first eval is still answering when the second one has loaded its
    # model (the smoke policy answered 120 questions in 10 s on idle cores, before the second came)
    TWICE = 600

    def eval_in_background(
        self, name: str, answers: int, n: int = 24
    ) -> tuple[list[str], Path, subprocess.Popen, bool]:
        """`pvpo eval` of `n` questions, 2 in flight, into `eval_<name>`, started in the background:
        its arguments, its predictions file, its process, and whether it saved `answers` answers."""
        args = [*self.eval_args(self.questions(f"{name}.jsonl", n), f"eval_{name}"), "--batch-size", "2"]
        preds = self.work / f"eval_{name}" / name / "predictions.jsonl"
        proc = popen(*args)
        return args, preds, proc, wait_for(lambda: lines_of(preds) >= answers, proc)

    def two_evals(self) -> Row:
        k = self.TWICE
        args, preds, first, started = self.eval_in_background("twice", 1, k)
        second = pvpo(*args)
        out = first.communicate(timeout=600)[0]
        again = pvpo(*args)
        n = (
            json.loads((preds.parent / "metrics.json").read_text())["n"]
            if (preds.parent / "metrics.json").exists()
            else -1
        )
        ok = started and one_line(second.out, second.rc, f"PID {first.pid}, pvpo eval") and first.returncode == 0
        return Row(
            f"two `pvpo eval` into the same `--out` at once ({k} questions), then the command again",
            f"second: rc {second.rc}: {first_error(second.out)[:110]}; first rc {first.returncode}, "
            f"{lines_of(preds)} rows, metrics N={n}; again: rc {again.rc}, "
            f"{f'N={k}' if f'N={k})' in again.out else f'N≠{k}'}",
            ok
            and n == k
            and lines_of(preds) == k
            and again.rc == 0
            and f"N={k})" in again.out
            and "Traceback" not in out,
        )

    def repeated_rows(self) -> Row:
        k = self.TWICE
        data = self.questions("twice.jsonl", k)
        args = [*self.eval_args(data, "eval_twice"), "--batch-size", "2"]  # the run the probe above completed
        preds = self.work / "eval_twice" / "twice" / "predictions.jsonl"
        rows = preds.read_text().splitlines()
        preds.write_text("\n".join(rows + rows[:12] + ['{"id": "3", "quest']) + "\n")
        res = pvpo(*args)
        warn = next((ln for ln in res.out.splitlines() if "dropped" in ln), "no warning")
        return Row(
            "`predictions.jsonl` with 12 rows twice and a damaged line (what two writers left), the command again",
            f"rc {res.rc}, {f'N={k}' if f'N={k})' in res.out else f'N≠{k}'}, {lines_of(preds)} rows; "
            f"{warn.split(': ', 1)[-1][:110]}",
            res.rc == 0 and f"N={k})" in res.out and lines_of(preds) == k and "dropped 1 damaged" in warn,
        )

    def two_trains(self) -> Row:
        run = self.copy_run("twotrains")
        first = popen("train", "--run-dir", str(run), "--resume", "run.steps=100000")
        latest = run / "checkpoints" / "latest"
        training = wait_for(lambda: latest.read_text() not in ("step_000001", "step_000002"), first)
        second = pvpo("train", "--run-dir", str(run), "--resume")
        first.kill()  # SIGKILL
        first.wait()
        at = int(latest.read_text().removeprefix("step_"))
        res = pvpo("train", "--run-dir", str(run), "--resume", f"run.steps={at + 2}")
        logged = steps(run)
        return Row(
            "a second `pvpo train --resume` while the first trains, then SIGKILL of the first and `--resume`",
            f"second: rc {second.rc}: {first_error(second.out)[:120]}; after the kill (at step_{at:06d}): "
            f"rc {res.rc}, steps {logged[0]}..{logged[-1]} logged once each",
            training
            and one_line(second.out, second.rc, f"PID {first.pid}, pvpo train")
            and res.rc == 0
            and logged == list(range(1, at + 3)),
        )

    def edited_config(self) -> Row:
        run = self.copy_run("edited")
        cfg = run / "config.yaml"
        text = cfg.read_text()
        cfg.write_text(
            text.replace("\n  lr: 0.0001\n", "\n  lr: 0.001\n").replace(
                "    hidden_size: 48\n", "    hidden_size: 64\n"
            )
        )
        before = (run / "metrics.jsonl").read_bytes()
        res = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=3")
        named = "optim.lr: checkpoint has 0.0001" in res.out and "model.tiny.hidden_size: checkpoint has 48" in res.out
        return Row(
            "a hand-edited run `config.yaml` (`model.tiny.hidden_size` 48 → 64, `optim.lr` 1e-4 → 1e-3), `--resume`",
            f"rc {res.rc}: {first_error(res.out)[:90]} … names both keys: {'yes' if named else 'no'}; metrics.jsonl "
            + ("unchanged" if (run / "metrics.jsonl").read_bytes() == before else "changed"),
            res.rc == 2 and named and "Traceback" not in res.out and (run / "metrics.jsonl").read_bytes() == before,
        )

    # ---- full and read-only disks ------------------------------------------------------------------
    def full_disk(self) -> Row:
        fault = "the disk fills up during a checkpoint (a 4 MB tmpfs, room for half a checkpoint), then space freed and `--resume`"
        with tmpfs(self.work / "fulldisk", "size=4m") as disk:
            if disk is None:
                return not_run(fault, "mounting a tmpfs needs root (tests/test_trainer_faults.py injects the fault)")
            run = disk / "run"
            shutil.copytree(self.base, run)
            ckpt = sum(p.stat().st_size for p in (run / "checkpoints" / "step_000002").rglob("*") if p.is_file())
            st = os.statvfs(disk)
            (disk / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - ckpt // 2))
            res = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=4")
            block = error_block(res.out)
            left = sorted(p.name for p in (run / "checkpoints").iterdir())
            (disk / "filler").unlink()
            again = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=4")
            logged = steps(run)
        return Row(
            fault,
            f"rc {res.rc}, {len(block)} lines: {' '.join(block[:1])[:110]}; left {', '.join(left)}; "
            f"resume rc {again.rc}, steps {logged}",
            one_line(res.out, res.rc, "no space left")
            and left == [".pvpo-folder.json", "latest", "step_000001", "step_000002"]  # the manifest: ours
            and again.rc == 0
            and logged == [1, 2, 3, 4],
        )

    def read_only_cache(self) -> Row:
        fault = "a read-only model cache (`$PVPO_CACHE_DIR` on a read-only tmpfs) at `pvpo models pull`"
        with tmpfs(self.work / "rocache", "ro,size=64k") as cache:
            if cache is None:
                return not_run(fault, "mounting a tmpfs needs root (tests/test_model_catalog.py injects the fault)")
            gguf = self.dataset("tiny.gguf", b"GGUF" + b"\0" * 64)
            env = {**ENV, "PVPO_CACHE_DIR": str(cache)}
            proc = subprocess.run(
                [sys.executable, "-m", "pvpo.cli", "models", "pull", str(gguf)],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
            )
        out = proc.stderr + proc.stdout
        return Row(
            fault,
            f"rc {proc.returncode}: {' / '.join(ln.strip() for ln in error_block(out)[:2])[:200]}",
            one_line(out, proc.returncode, "read-only"),
        )

    # ---- damaged files ----------------------------------------------------------------------------
    def index_copy(self, name: str) -> Path:
        index = self.work / f"index_{name}"
        shutil.copytree(self.base / "index", index)
        (index / name).write_bytes((index / name).read_bytes()[:20])
        return index

    def damaged_index(self, name: str) -> Row:
        index = self.index_copy(name)
        res = pvpo("retriever", "serve", "--index", str(index), "--port", str(free_port()), timeout=300)
        return Row(
            f"a cut `{name}` (20 bytes left) at `pvpo retriever serve`",
            f"rc {res.rc}, {len(error_block(res.out))} lines: {first_error(res.out)[:130]}",
            one_line(res.out, res.rc, f"{name} is damaged"),
        )

    def damaged_offsets(self) -> Row:
        index = self.index_copy("corpus.offsets.npy")
        port = free_port()
        server = popen("retriever", "serve", "--index", str(index), "--port", str(port))
        try:
            import httpx

            def healthy() -> bool:
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            up = wait_for(healthy, server)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
            out = server.communicate(timeout=60)[0]
        warn = next((ln for ln in out.splitlines() if "is damaged" in ln), "no warning")
        return Row(
            "a cut `corpus.offsets.npy` (a cache) at `pvpo retriever serve`",
            f"{'serves' if up else 'does not serve'}; {warn.split(': ', 1)[-1][:170]}",
            up and "corpus.offsets.npy is damaged" in warn and "rebuilding it" in warn,
        )

    def model_fault(self, fault: str, name: str, damage: Callable[[Path], object] | None, expect: str) -> Row:
        model = self.work / f"model_{name}"
        if damage is None:
            model.mkdir()
        else:
            shutil.copytree(self.base / "checkpoints" / "step_000002" / "policy", model)
            damage(model)
        res = pvpo(*self.eval_args(self.questions("m.jsonl", 2), f"eval_{name}", model=model))
        return Row(fault, f"rc {res.rc}: {first_error(res.out)[:140]}", one_line(res.out, res.rc, expect))

    def duplicate_id(self) -> Row:
        path = self.dataset(
            "dup.jsonl", jsonl([{"id": "1", "question": q, "golden_answers": ["a"]} for q in ("x?", "y?")])
        )
        res = pvpo(*self.eval_args(path, "eval_dup"))
        return Row(
            "a duplicate question id in an eval dataset",
            f"rc {res.rc}: {first_error(res.out)[:120]}",
            one_line(res.out, res.rc, "in dataset $W/data/dup.jsonl".replace("$W", str(self.work)))
            and "PosixPath" not in res.out,
        )

    # ---- signals and the verl extra ------------------------------------------------------------------
    def sigterm_train(self) -> Row:
        run = self.copy_run("sigterm")
        proc = popen("train", "--run-dir", str(run), "--resume", "run.steps=100000")
        latest = run / "checkpoints" / "latest"
        running = wait_for(lambda: latest.read_text() not in ("step_000001", "step_000002"), proc)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
        tail = out.strip().splitlines()[-2:]
        last = tail[-1] if tail else ""
        left = [p.name for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]
        shown = last if last.startswith("stopped by") else " ⏎ ".join(tail)  # what came instead of the line
        return Row(
            "SIGTERM during `pvpo train`",
            f"rc {proc.returncode}: {shown[:300]}{'; left ' + ', '.join(left) if left else ''}",
            running
            and proc.returncode == 143
            and last.startswith("stopped by SIGTERM: ")
            and "--resume`" in last
            and not left,
        )

    def sigterm_eval(self) -> Row:
        args, _, proc, running = self.eval_in_background("stopped", 2)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
        last = out.strip().splitlines()[-1] if out.strip() else ""
        again = pvpo(*args)
        return Row(
            "SIGTERM during `pvpo eval`, then the same command again",
            f"rc {proc.returncode}: {last[:170]}; again: rc {again.rc}, {'N=24' if 'N=24)' in again.out else 'N≠24'}",
            running
            and proc.returncode == 143
            and "run the same command again" in last
            and again.rc == 0
            and "N=24)" in again.out,
        )

    def verl_missing(self) -> Row:
        code = "import pvpo.integrations.verl.agent_loop"
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120
        )
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        return Row(
            "`import pvpo.integrations.verl.agent_loop` without verl installed",
            last,
            "pip install 'pvpo-search[verl]'" in last,
        )

    def rows(self) -> list[Row]:
        """Every probe of this round, in the table's order (the smoke run and the loopback
        retriever of `bench/faults/run.py` already up)."""

        def cut(name: str) -> Callable[[Path], object]:
            return lambda m: (m / name).write_bytes((m / name).read_bytes()[: (m / name).stat().st_size // 2])

        def drop(*names: str) -> Callable[[Path], object]:
            return lambda m: [(m / n).unlink() for n in names]

        probes = [
            self.two_evals,
            self.repeated_rows,
            self.two_trains,
            self.edited_config,
            self.full_disk,
            self.read_only_cache,
            lambda: self.damaged_index("index.faiss"),
            lambda: self.damaged_index("meta.json"),
            self.damaged_offsets,
            lambda: self.model_fault(
                "model weights missing at `pvpo eval --model`", "noweights", drop("model.safetensors"), "has no weights"
            ),
            lambda: self.model_fault(
                "model weights truncated to half at `pvpo eval --model`",
                "halfweights",
                cut("model.safetensors"),
                "model.safetensors is damaged",
            ),
            lambda: self.model_fault(
                "a model folder without its tokenizer",
                "notokenizer",
                drop("tokenizer.json", "tokenizer_config.json"),
                "has no tokenizer",
            ),
            lambda: self.model_fault("an empty model folder", "empty", None, "is empty"),
            self.duplicate_id,
            self.sigterm_train,
            self.sigterm_eval,
            self.verl_missing,
        ]
        return run_probes(probes)
