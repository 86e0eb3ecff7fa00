"""The third round of the fault table (`bench/faults/run.py` runs it), tried as a hostile or unlucky
user would: a user's files in the folders pvpo writes (with and without `--overwrite`), a storm
of Ctrl-C while a replaced run waits to be dropped, two datasets of one name, secrets in values
that get echoed, a typo in the reward's parameters, a YAML alias bomb, a model-written query
longer than the retriever takes, damaged state files, a kill between a state file and the first
checkpoint, odd run-dir paths (250 characters, a symlink loop, a mount point), an encoder that is
not cached offline, two index builds into one folder, a 40 MB request header, a busy port.

Each probe runs the `pvpo` CLI (or the gym env) as a user would, on the smoke run's checkpoints,
policy and index, and checks the exit status, the message and the files left behind.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.faults.probes import (
    SMOKE,
    Probes,
    Row,
    error_block,
    first_error,
    free_port,
    jsonl,
    not_run,
    one_line,
    popen,
    pvpo,
    python,
    run_probes,
    snapshot,
    steps,
    tmpfs,
    wait_for,
)

NOTES = b"a user's notes\n"
THESIS = b"chapter 1: why nothing is ever deleted\n"
# keys that differ between two runs of the same config (wall time, memory)
_VOLATILE = ("time/", "mem/")


def _no_record(files: dict[str, bytes]) -> dict[str, bytes]:
    """A snapshot without pvpo's folder record (`pvpo.owned`): bookkeeping a command may add."""
    return {k: v for k, v in files.items() if k != ".pvpo-folder.json"}


def _metrics(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(_VOLATILE) and "_s_per" not in k} for r in rows]


def _differing(a: dict[str, object], b: dict[str, object]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


@contextmanager
def _chat_endpoint(turns: Callable[[str], str]) -> Iterator[str]:
    """A stand-in OpenAI-compatible endpoint on loopback answering each request with
    `turns(request body)`; yields its base URL."""

    class Chat(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            content = turns(body)
            reply = {
                "choices": [  # `text` for the completions API, `message` for chat
                    {
                        "index": 0,
                        "text": content,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": len(content) // 4},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()


class HostileUser(Probes):
    """The third round's probes; each returns a table row."""

    # ---- nothing a user owns is deleted ----------------------------------------------------------
    def eval_overwrite_keeps_a_users_file(self) -> Row:
        data = self.dataset("uq/questions.jsonl", jsonl([{"id": "1", "question": "q?", "golden_answers": ["a"]}]))
        out = self.work / "eval_thesis"
        (out / "uq").mkdir(parents=True)
        (out / "uq" / "thesis.txt").write_bytes(THESIS)
        refused = pvpo(*self.eval_args(data, "eval_thesis"))
        res = pvpo(*self.eval_args(data, "eval_thesis"), "--overwrite")
        kept = (out / "uq" / "thesis.txt").read_bytes() == THESIS
        return Row(
            "`pvpo eval --overwrite` with a user's `thesis.txt` in `OUT/<dataset>/`",
            f"without: rc {refused.rc}: {first_error(refused.out)[:110]}; with: rc {res.rc}, "
            f"{'N=1' if 'N=1)' in res.out else 'N≠1'}; thesis.txt {'kept byte for byte' if kept else 'LOST'}",
            one_line(refused.out, refused.rc, "thesis.txt") and res.rc == 0 and "N=1)" in res.out and kept,
        )

    def datasets_of_one_file_name(self) -> Row:
        a = self.dataset("a_mini/questions.jsonl", jsonl([{"id": "1", "question": "qa?", "golden_answers": ["a"]}]))
        b = self.dataset("b_mini/questions.jsonl", jsonl([{"id": "1", "question": "qb?", "golden_answers": ["b"]}]))
        args = self.eval_args(a, "eval_pair")
        res = pvpo(*args, "--dataset", str(b))
        out = self.work / "eval_pair"
        folders = sorted(p.name for p in out.iterdir() if p.is_dir()) if out.is_dir() else []
        x = self.dataset("x/hp/questions.jsonl", jsonl([{"id": "1", "question": "qx?", "golden_answers": ["x"]}]))
        y = self.dataset("y/hp/questions.jsonl", jsonl([{"id": "1", "question": "qy?", "golden_answers": ["y"]}]))
        clash = pvpo(*self.eval_args(x, "eval_clash"), "--dataset", str(y))
        named = pvpo(*self.eval_args(x, "eval_named"), "--dataset", str(y), "--name", "hp_x", "--name", "hp_y")
        named_dirs = sorted(p.name for p in (self.work / "eval_named").glob("hp_*"))
        return Row(
            "two `--dataset` files named `questions.jsonl` (`a_mini/`, `b_mini/`); two whose folders share a name "
            "(`x/hp/`, `y/hp/`), then with `--name`",
            f"rc {res.rc}, folders {folders}; shared name: rc {clash.rc}: {first_error(clash.out)[:100]}; "
            f"--name: rc {named.rc}, {named_dirs}",
            res.rc == 0
            and folders == ["a_mini", "b_mini"]
            and one_line(clash.out, clash.rc, "both named 'hp'")
            and not (self.work / "eval_clash").exists()
            and named.rc == 0
            and named_dirs == ["hp_x", "hp_y"],
        )

    def ctrl_c_storm_during_overwrite(self) -> Row:
        run = self.copy_run("storm")
        before = snapshot(run)
        proc = popen("train", "--config", SMOKE, "--run-dir", str(run), "--overwrite")
        aside = run / ".pvpo-replaced" / "config.yaml"  # the old run's moved aside, the new run's written
        started = wait_for(lambda: aside.exists() and (run / "config.yaml").exists(), proc, poll=0.01)
        no_ckpt = not (run / "checkpoints" / "latest").exists()
        for _ in range(40):
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGINT)
            time.sleep(0.005)
        out = proc.communicate(timeout=300)[0]
        back = _no_record(snapshot(run)) == _no_record(before)
        res = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=3")
        after = snapshot(run)
        old_kept = all(after.get(k) == v for k, v in before.items() if k.startswith("checkpoints/step_000002/"))
        logged = steps(run) if (run / "metrics.jsonl").exists() else []
        tail = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or [""]
        return Row(
            "Ctrl-C 40 times 5 ms apart during `pvpo train --overwrite`, before the new run's first checkpoint; "
            "then `--resume`",
            f"{'' if started and no_ckpt else 'the storm missed its moment; '}rc {proc.returncode}"
            f"{', Exception ignored' if 'Exception ignored' in out else ''}"
            f"{', traceback' if 'Traceback' in out else ''}: {tail[0][:110]}; old run "
            f"{'back byte for byte' if back else 'NOT back'}; resume rc {res.rc}, steps {logged}, "
            f"old step_000002 {'kept' if old_kept else 'DELETED'}",
            started
            and no_ckpt
            and proc.returncode == 130
            and "logged 2 step(s), checkpointed at step_000002" in tail[0]
            and "Exception ignored" not in out
            and "Traceback" not in out
            and back
            and res.rc == 0
            and logged == [1, 2, 3]
            and old_kept
            and after.get("notes.txt") == NOTES,
        )

    def overwrite_a_folder_that_is_no_run(self) -> Row:
        mine = self.work / "thesis_dir"
        mine.mkdir()
        (mine / "thesis.txt").write_bytes(THESIS)
        refused = pvpo("train", "--config", SMOKE, "--run-dir", str(mine), "run.steps=1")
        res = pvpo("train", "--config", SMOKE, "--run-dir", str(mine), "--overwrite", "run.steps=1")
        kept = (mine / "thesis.txt").read_bytes() == THESIS
        return Row(
            "`pvpo train` and `pvpo train --overwrite` on a folder that is not a run (only `thesis.txt`)",
            f"without: rc {refused.rc}: {first_error(refused.out)[:100]}; with: rc {res.rc}; thesis.txt "
            f"{'kept byte for byte' if kept else 'LOST'}",
            one_line(refused.out, refused.rc, "thesis.txt") and res.rc == 0 and kept,
        )

    # ---- no secret is echoed ---------------------------------------------------------------------
    def secrets_masked(self) -> Row:
        digits, password = "8731129940215566", "PASSWORD99"
        show = pvpo("config", "show", f"retriever.token={digits}")
        typed = pvpo("train", "--config", SMOKE, "--run-dir", str(self.work / "tok"), f"retriever.token=[{digits}]")
        port = free_port()  # nothing listens there
        url = f"http://admin:{password}@127.0.0.1:{port}"
        query = pvpo("retriever", "query", "--url", url, "--retries", "0", "who?")
        train = pvpo(
            "train", "--config", SMOKE, "--run-dir", str(self.work / "creds"), f"retriever.url={url}",
            "retriever.retries=0",
        )  # fmt: skip
        leaks = [name for name, o in (("show", show), ("type error", typed), ("query", query), ("train", train))
                 if digits in o.out or password in o.out]  # fmt: skip
        return Row(
            "secrets echoed: `config show retriever.token=<digits>`, a token of the wrong type, a URL with "
            "credentials at `retriever query` and `train`",
            f"show rc {show.rc}; type error rc {typed.rc}; query rc {query.rc}: {first_error(query.out)[:90]}; "
            f"train rc {train.rc}; leaked in: {leaks or 'none'}",
            not leaks
            and show.rc == 0
            and "***" in show.out
            and typed.rc == 2
            and query.rc == 2
            and train.rc == 2
            and "admin:***@" in query.out,
        )

    def reward_params_typo(self) -> Row:
        res = pvpo(
            "train", "--config", SMOKE, "--run-dir", str(self.work / "typo"), "algorithm.reward_params.foramt_score=0.1"
        )
        code = (
            "import gymnasium, pvpo.envs\n"
            "try:\n"
            "    gymnasium.make('pvpo/SearchQA-v0', reward_params={'foramt_score': 0.1}, retriever_url='http://127.0.0.1:9')\n"
            "    print('accepted')\n"
            "except ValueError as e:\n"
            "    print('refused:', e)\n"
        )
        env = python(code)
        said = next((ln for ln in env.out.splitlines() if ln.startswith(("refused", "accepted"))), env.out[-100:])
        return Row(
            "a typo in `algorithm.reward_params` (`foramt_score=0.1`); the same in `gymnasium.make(..., reward_params=)`",
            f"train rc {res.rc}: {' '.join(error_block(res.out)[:2])[:120]}; gym: {said[:100]}",
            res.rc == 2
            and "foramt_score" in res.out
            and "Traceback" not in res.out
            and not (self.work / "typo").exists()
            and said.startswith("refused")
            and "foramt_score" in said,
        )

    def yaml_bomb(self) -> Row:
        lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
            lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
        bomb = self.dataset("bomb.yaml", ("\n".join(lines) + "\n").encode())
        show = pvpo("config", "show", "--config", str(bomb), timeout=120)
        train = pvpo("train", "--config", str(bomb), "--run-dir", str(self.work / "bomb"), timeout=120)
        dup = self.dataset("dup.yaml", b"run:\n  steps: 3\nrollout:\n  n: 4\nrun:\n  seed: 7\n")
        twice = pvpo("train", "--config", str(dup), "--run-dir", str(self.work / "dup"))
        return Row(
            "a YAML alias bomb (9 levels of 9 aliases) at `config show` and `train`; a config giving `run:` twice",
            f"show rc {show.rc} in {show.seconds:.0f} s, train rc {train.rc} in {train.seconds:.0f} s: "
            f"{first_error(show.out)[:90]}; twice: rc {twice.rc}: {first_error(twice.out)[:80]}",
            one_line(show.out, show.rc, "alias bomb")
            and one_line(train.out, train.rc, "alias bomb")
            and one_line(twice.out, twice.rc, "'run' is given twice"),
        )

    def long_model_query(self) -> Row:
        query = ("what is the name of the river " * 108)[:3239]

        def turns(body: str) -> str:
            return "<answer> a </answer>" if "Doc 1(Title" in body else f"<search> {query} </search>"

        data = self.questions("longq.jsonl", 2)
        with _chat_endpoint(turns) as base_url:
            res = pvpo(
                "eval", "--engine", "openai", "--base-url", base_url, "--model-name", "stand-in", "--dataset",
                str(data), "--retriever-url", self.url, "--out", str(self.work / "eval_longq"), "--quiet",
            )  # fmt: skip
        warn = next((ln for ln in res.out.splitlines() if "was cut to" in ln), "no warning")
        preds = self.work / "eval_longq" / "longq" / "predictions.jsonl"
        items = [json.loads(x) for x in preds.read_text().splitlines()] if preds.exists() else []
        searched = sorted({len(q) for it in items for q in it["output"]["queries"]})
        code = (
            "import gymnasium, pvpo.envs\n"
            f"env = gymnasium.make('pvpo/SearchQA-v0', retriever_url={self.url!r})\n"
            "env.reset(options={'question': {'uid': 'q/1', 'question': 'q?', 'golden_answers': ['a']}})\n"
            f"obs, r, term, trunc, info = env.step('<search> ' + {query!r} + ' </search>')\n"
            "print('cut', info['num_queries_cut'], 'chars', len(info['queries'][0]))\n"
        )
        gym = python(code)
        said = next((ln for ln in gym.out.splitlines() if ln.startswith("cut")), gym.out.strip()[-120:])
        return Row(
            "a model-written `<search>` query of 3,239 characters (over the server's 2,048): `pvpo eval` through a "
            "stand-in endpoint, and the gym env's `step()`",
            f"eval rc {res.rc}, {'N=2' if 'N=2)' in res.out else 'N≠2'}, queries searched of {searched} characters; "
            f"{warn.split(': ', 1)[-1][:90]}; gym: {said}",
            res.rc == 0
            and "N=2)" in res.out
            and searched
            and max(searched) <= 2048
            and "was cut to 2048" in warn
            and said.startswith("cut 1 chars"),
        )

    # ---- damaged state, a kill between state and checkpoint ------------------------------------------
    def damaged_run_state(self) -> Row:
        run = self.copy_run("runstate")
        saved = run / "checkpoints" / "step_000002" / "run_state" / "gt_cache.json"
        saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
        top = (run / "gt_cache.json").read_bytes()
        res = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=3")
        return Row(
            "a truncated `run_state/gt_cache.json` in the latest checkpoint, then `--resume`",
            f"rc {res.rc}: {first_error(res.out)[:140]}; top-level gt_cache.json "
            + ("unchanged" if (run / "gt_cache.json").read_bytes() == top else "OVERWRITTEN"),
            one_line(res.out, res.rc, "run_state/gt_cache.json is damaged")
            and (run / "gt_cache.json").read_bytes() == top,
        )

    def kill_before_first_checkpoint_costs(self) -> Row:
        run = self.work / "costkill"
        proc = popen("train", "--config", SMOKE, "--run-dir", str(run))
        saved = wait_for(lambda: (run / "gt_cache.json").exists(), proc, poll=0.005)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        no_ckpt = not (run / "checkpoints" / "latest").exists()
        res = pvpo("train", "--run-dir", str(run), "--resume")
        keys = ("cost/cum_anchor_rollouts", "cost/cum_gt_rollouts", "cost/cum_rollouts", "cost/cum_tool_calls")
        a = [{k: r.get(k) for k in keys} for r in _metrics(self.base)]
        b = [{k: r.get(k) for k in keys} for r in _metrics(run)] if (run / "metrics.jsonl").exists() else []
        return Row(
            "SIGKILL once the GT cache is written, before the first checkpoint, then `--resume`: the cost counters",
            f"{'killed before a checkpoint' if saved and no_ckpt else 'the kill missed its moment'}; resume rc "
            f"{res.rc}; step 1 anchor/GT rollouts {b[0]['cost/cum_anchor_rollouts'] if b else '?'}/"
            f"{b[0]['cost/cum_gt_rollouts'] if b else '?'} (unbroken run {a[0]['cost/cum_anchor_rollouts']}/"
            f"{a[0]['cost/cum_gt_rollouts']}); {'identical' if a == b else 'DIFFER'} at every step",
            saved and no_ckpt and res.rc == 0 and a == b,
        )

    def resume_from_the_first_checkpoint(self) -> Row:
        run = self.copy_run("firstckpt")
        shutil.rmtree(run / "checkpoints" / "step_000002")
        (run / "checkpoints" / "latest").write_text("step_000001")
        res = pvpo("train", "--run-dir", str(run), "--resume")
        a, b = _metrics(self.base), _metrics(run)
        diff = _differing(a[-1], b[-1]) if len(a) == len(b) == 2 else ["(steps differ)"]
        return Row(
            "a resume from the first checkpoint: step 2's metrics (all but time/*, mem/*) against the unbroken run",
            f"rc {res.rc}; " + ("identical" if not diff else f"{len(diff)} differ: {', '.join(diff[:4])}"),
            res.rc == 0 and not diff,
        )

    def damaged_state_files_at_resume(self) -> Row:
        gs = self.copy_run("gs5")
        doc = gs / "checkpoints" / "step_000002" / "run_state" / "group_sampling.json"
        doc.write_text(json.dumps({**json.loads(doc.read_text()), "gt": 5}))
        res_gs = pvpo("train", "--run-dir", str(gs), "--resume", "run.steps=3")
        five = self.copy_run("metrics5")
        five.joinpath("metrics.jsonl").write_text("5\n" + five.joinpath("metrics.jsonl").read_text())
        res_five = pvpo("train", "--run-dir", str(five), "--resume", "run.steps=3")
        text = self.copy_run("metrics_str")
        rows = text.joinpath("metrics.jsonl").read_text().splitlines()
        text.joinpath("metrics.jsonl").write_text(rows[0] + "\n" + rows[1].replace('"step": 2', '"step": "2"') + "\n")
        res_text = pvpo("train", "--run-dir", str(text), "--resume", "run.steps=3")
        return Row(
            '`group_sampling.json` with `"gt": 5`; a line `5`, or `"step": "2"`, in `metrics.jsonl`; each at `--resume`',
            f"gt: rc {res_gs.rc}: {first_error(res_gs.out)[:90]}; `5`: rc {res_five.rc}; "
            f'`"2"`: rc {res_text.rc}: {first_error(res_text.out)[:80]}',
            one_line(res_gs.out, res_gs.rc, "group_sampling.json is damaged")
            and one_line(res_five.out, res_five.rc, "metrics.jsonl: row 1")
            and one_line(res_text.out, res_text.rc, "metrics.jsonl: row 2"),
        )

    # ---- odd paths ------------------------------------------------------------------------------
    def odd_run_dirs(self) -> Row:
        long = self.work / ("r" * 250)
        res_long = pvpo("train", "--run-dir", str(long), "--resume")
        loop = self.work / "loop"
        os.symlink(loop, loop)
        res_loop = pvpo("train", "--config", SMOKE, "--run-dir", str(loop))
        res_nproc = pvpo("train", "--run-dir", str(self.base), "--resume", "--nproc", "2")
        return Row(
            "a 250-character run-dir name (`--resume`); a symlink loop as `--run-dir`; `--nproc 2 --resume` "
            "of a one-process run",
            f"long: rc {res_long.rc}: {first_error(res_long.out)[:60]}; loop: rc {res_loop.rc}: "
            f"{first_error(res_loop.out)[:70]}; nproc: rc {res_nproc.rc}, {len(res_nproc.out.splitlines())} lines",
            one_line(res_long.out, res_long.rc, "nothing to resume")
            and one_line(res_loop.out, res_loop.rc, "loop")
            and one_line(res_nproc.out, res_nproc.rc, "1 process(es)"),
        )

    def overwrite_a_mount_point(self) -> Row:
        fault = "`pvpo train --overwrite` of a run dir that is a mount point (a tmpfs)"
        with tmpfs(self.work / "mnt", "size=256m") as mnt:
            if mnt is None:
                return not_run(fault, "mounting a tmpfs needs root")
            for p in self.base.iterdir():
                (shutil.copytree if p.is_dir() else shutil.copy2)(p, mnt / p.name)
            (mnt / "notes.txt").write_bytes(NOTES)
            res = pvpo("train", "--config", SMOKE, "--run-dir", str(mnt), "--overwrite", "run.steps=1")
            kept = (mnt / "notes.txt").read_bytes() == NOTES
            logged = steps(mnt) if (mnt / "metrics.jsonl").exists() else []
        return Row(
            fault,
            f"rc {res.rc}{': ' + first_error(res.out)[:100] if res.rc else ''}; steps {logged}; notes.txt "
            f"{'kept' if kept else 'LOST'}",
            res.rc == 0 and logged == [1] and kept,
        )

    def encoder_not_cached(self) -> Row:
        corpus = self.dataset("enc_corpus.jsonl", jsonl([{"id": "1", "contents": "a b"}, {"id": "2", "contents": "c"}]))
        build = pvpo("retriever", "build", "--corpus", str(corpus), "--out", str(self.work / "enc_idx"), "--model",
                     "intfloat/e5-base-v2")  # fmt: skip
        index = self.work / "enc_served"
        shutil.copytree(self.base / "index", index)
        meta = json.loads((index / "meta.json").read_text())
        (index / "meta.json").write_text(json.dumps({**meta, "model": "intfloat/e5-base-v2"}))
        serve = pvpo("retriever", "serve", "--index", str(index), "--port", str(free_port()), timeout=300)
        return Row(
            "`retriever build` / `serve` with an encoder not in the cache, offline",
            f"build: rc {build.rc}, {len(build.out.splitlines())} lines: {first_error(build.out)[:80]}; "
            f"serve: rc {serve.rc}, {len(serve.out.splitlines())} lines",
            one_line(build.out, build.rc, "not in the Hugging Face cache")
            and one_line(serve.out, serve.rc, "not in the Hugging Face cache"),
        )

    # ---- smaller ------------------------------------------------------------------------------------
    def temp_files_removed(self) -> Row:
        run = self.copy_run("tmpfiles")
        planted = [run / "checkpoints" / ".latest.k2j4x9.tmp", run / ".gt_cache.json.a8d3q1.tmp"]
        for p in planted:
            p.write_text("half")
        res = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=2")
        left = [p.name for p in planted if p.exists()]
        return Row(
            "temporary files a killed write left (`checkpoints/.latest.*.tmp`, `.gt_cache.json.*.tmp`), then `--resume`",
            f"rc {res.rc}; left: {', '.join(left) or 'none'}",
            res.rc == 0 and not left,
        )

    def two_index_builds(self) -> Row:
        rows = [{"id": str(i), "contents": f"passage {i} about entity {i}"} for i in range(400)]
        corpus = self.dataset("two_builds.jsonl", jsonl(rows))
        out = self.work / "two_builds"
        first = popen("retriever", "build", "--corpus", str(corpus), "--out", str(out))
        lock = self.work / ".two_builds.pvpo-lock"
        held = wait_for(lambda: lock.exists() and lock.read_text().strip() != "", first, poll=0.01)
        second = pvpo("retriever", "build", "--corpus", str(corpus), "--out", str(out))
        out1 = first.communicate(timeout=600)[0]
        size = json.loads((out / "meta.json").read_text())["size"] if (out / "meta.json").exists() else -1
        return Row(
            "two `pvpo retriever build` into one folder at once (400 passages)",
            f"second: rc {second.rc}: {first_error(second.out)[:110]}; first: rc {first.returncode}, size {size}",
            held
            and one_line(second.out, second.rc, f"PID {first.pid}, pvpo retriever build")
            and first.returncode == 0
            and size == 400
            and "Traceback" not in out1,
        )

    def huge_headers(self, server_pid: int) -> Row:
        port = int(self.url.rsplit(":", 1)[1])
        rss0 = _rss_mb(server_pid)
        statuses: list[str] = []

        def client() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
                status = "closed"
                try:
                    for _ in range(40 * 16):  # 40 MB in 64 KiB pieces, unless the server stops it
                        s.sendall(b"a" * 65536)
                    s.sendall(b"\r\n\r\n")
                except OSError:
                    pass
                try:
                    status = s.recv(64).split(b" ")[1].decode() or "closed"
                except (OSError, IndexError):
                    pass
                statuses.append(status)

        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        grown = _rss_mb(server_pid) - rss0
        health = python(f"import httpx; print(httpx.get('{self.url}/health', timeout=30).status_code)")
        seen = {s: statuses.count(s) for s in sorted(set(statuses))}
        return Row(
            "16 clients each sending a 40 MB request header",
            f"answers {seen}; server RSS {grown:+.0f} MB; /health afterwards: {health.out.strip()[-3:]}",
            len(statuses) == 16 and "200" not in seen and grown < 64 and health.out.strip().endswith("200"),
        )

    def busy_port(self) -> Row:
        port = int(self.url.rsplit(":", 1)[1])
        res = pvpo("retriever", "serve", "--index", str(self.base / "index"), "--port", str(port), timeout=300)
        return Row(
            "`pvpo retriever serve` on a port another server holds",
            f"rc {res.rc} in {res.seconds:.0f} s, {len(error_block(res.out))} lines: {first_error(res.out)[:100]}",
            one_line(res.out, res.rc, f"port {port}") and res.seconds < 30,
        )

    def eval_inputs(self) -> Row:
        data = self.questions("limit0.jsonl", 2)
        zero = pvpo(*self.eval_args(data, "eval_limit0"), "--limit", "0")
        mixed_rows = [
            {"id": "1", "question": "q1?", "golden_answers": ["a"]},
            {"id": "2", "question": "q2?", "answer": "b", "paragraphs": [], "question_decomposition": []},
        ]
        mixed = pvpo(*self.eval_args(self.dataset("mixed.jsonl", jsonl(mixed_rows)), "eval_mixed"))
        out = self.work / "eval_file"
        out.mkdir()
        (out / "named").write_bytes(NOTES)
        taken = pvpo(*self.eval_args(self.questions("named.jsonl", 1), "eval_file"))
        slash = pvpo(*self.eval_args(data, "eval_slash"), "--name", "a/b")
        return Row(
            "`--limit 0`; a dataset mixing FlashRAG and MuSiQue rows; `OUT/<dataset>` taken by a user's file; "
            "`--name a/b`",
            f"limit: rc {zero.rc}; mixed: rc {mixed.rc}, {'N=2' if 'N=2)' in mixed.out else 'N≠2'}"
            f"{', skipped rows' if 'skipped' in mixed.out else ''}; taken: rc {taken.rc}; slash: rc {slash.rc}",
            zero.rc == 2
            and "--limit" in zero.out
            and "holds no questions" not in zero.out
            and mixed.rc == 0
            and "N=2)" in mixed.out
            and "skipped" not in mixed.out
            and one_line(taken.out, taken.rc, "named")
            and (out / "named").read_bytes() == NOTES
            and one_line(slash.out, slash.rc, "'a/b'"),
        )

    def reset_without_uid(self) -> Row:
        code = (
            "import gymnasium, pvpo.envs\n"
            f"env = gymnasium.make('pvpo/SearchQA-v0', retriever_url={self.url!r})\n"
            "obs, info = env.reset(options={'question': {'question': 'who?', 'golden_answers': ['a']}})\n"
            "print('uid', info['uid'])\n"
        )
        res = python(code)
        said = next((ln for ln in res.out.splitlines() if ln.startswith("uid")), res.out.strip()[-100:])
        return Row(
            "`reset(options={'question': {...}})` without a uid",
            f"rc {res.rc}: {said[:100]}",
            res.rc == 0 and said.startswith("uid given/"),
        )

    def rows(self, server: subprocess.Popen) -> list[Row]:
        """Every probe of this round, in the table's order (the smoke run and the loopback
        retriever `server` of `bench/faults/run.py` up)."""
        return run_probes(
            [
                self.eval_overwrite_keeps_a_users_file,
                self.datasets_of_one_file_name,
                self.ctrl_c_storm_during_overwrite,
                self.overwrite_a_folder_that_is_no_run,
                self.secrets_masked,
                self.reward_params_typo,
                self.yaml_bomb,
                self.long_model_query,
                self.damaged_run_state,
                self.kill_before_first_checkpoint_costs,
                self.resume_from_the_first_checkpoint,
                self.damaged_state_files_at_resume,
                self.odd_run_dirs,
                self.overwrite_a_mount_point,
                self.encoder_not_cached,
                self.temp_files_removed,
                self.two_index_builds,
                lambda: self.huge_headers(server.pid),
                self.busy_port,
                self.eval_inputs,
                self.reset_without_uid,
            ]
        )


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")
