"""A user's files in the fourth round of the fault table (`bench/faults/run.py --rounds 4` runs it beside
the round's secrets and bad-input probes): the ways an output flag, a resume
or a default folder used to lose a user's data - `retriever build` into a user's folder holding a
`meta.json` and `embeddings/`, onto its own corpus, over a finished index of another corpus; the
trainer's `retriever.index_dir` naming a user's data folder; a user's `step_000002_good` copy at
checkpoint pruning; `pvpo view --out` onto a run's or an evaluation's own files or a user's file;
`eval report --md/--csv` onto a user's files; `pvpo demo` into a training run's folder and the two
commands' default folders; `--overwrite` with a user's files nested in `checkpoints/`, and `eval
--out` onto a folder whose only marker is a user's `run.json`.

Each probe runs the `pvpo` CLI as a user would, on copies of the smoke run (`Probes.base`), and
checks the exit status, the message (one line naming the path and the fix, no traceback) and every
byte of the user's files. Run alone (`python bench/faults/ownership.py`), it trains the smoke run
and serves its index first, as `bench/faults/run.py` does.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.faults.probes import (
    SMOKE,
    Probes,
    Row,
    first_error,
    free_port,
    jsonl,
    one_line,
    print_alone,
    pvpo,
    python,
    run_probes,
    serve_index,
    snapshot,
    stop,
)

NOTES = b"a user's notes\n"


def _corpus(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonl(rows))
    return path


PASSAGES = [{"id": str(i), "contents": f"Entity {i} lives in town {i % 3}."} for i in range(12)]


class Ownership(Probes):
    """The probes of items 1-9; each returns a table row."""

    def _said(self, out: str, n: int = 110) -> str:
        """The refusal's line, the scratch folder shown as $W before it is cut to `n` characters."""
        return first_error(out.replace(str(self.work), "$W"))[:n]

    def _users_data(self, name: str, *, meta: bool = True) -> Path:
        """A user's data folder: a corpus with its own fields (url, title), embeddings/ and, with
        `meta`, a meta.json of the user's own."""
        data = self.work / name
        (data / "embeddings").mkdir(parents=True)
        (data / "embeddings" / "part_0.npy").write_bytes(b"the user's vectors")
        _corpus(data / "corpus.jsonl", [{"id": "1", "title": "T", "text": "body", "url": "https://x.org/1"}])
        if meta:
            (data / "meta.json").write_text('{"project": "my thesis data"}')
        return data

    # ---- retriever build (items 1-3) ------------------------------------------------------------
    def build_into_a_users_folder(self) -> Row:
        data = self._users_data("own_data1")
        corpus = _corpus(self.work / "own_c.jsonl", PASSAGES)
        before = snapshot(data)
        plain = pvpo("retriever", "build", "--corpus", str(corpus), "--out", str(data))
        over = pvpo("retriever", "build", "--corpus", str(corpus), "--out", str(data), "--overwrite")
        kept = snapshot(data) == before
        return Row(
            "1. `retriever build --out P`, P a user's folder holding its own `meta.json` and `embeddings/`",
            f"rc {plain.rc}: {self._said(plain.out, 110)}; --overwrite: rc {over.rc}; "
            + ("every file kept byte for byte" if kept else "**the user's files changed**"),
            one_line(plain.out, plain.rc, str(data)) and one_line(over.out, over.rc, "pvpo did not write") and kept,
        )

    def build_onto_its_own_corpus(self) -> Row:
        data = self._users_data("own_data2")
        index = self.work / "own_idx2"
        built = pvpo("retriever", "build", "--corpus", str(_corpus(self.work / "own_c.jsonl", PASSAGES)),
                     "--out", str(index), "--index-type", "bm25")  # fmt: skip
        mine = index / "corpus.jsonl"
        mine.write_bytes((data / "corpus.jsonl").read_bytes())  # the user's corpus, kept where the index is
        before_user, before_index = snapshot(data), snapshot(index)
        in_user = pvpo("retriever", "build", "--corpus", str(data / "corpus.jsonl"), "--out", str(data))
        in_index = pvpo("retriever", "build", "--corpus", str(mine), "--out", str(index), "--overwrite")
        kept = snapshot(data) == before_user and snapshot(index) == before_index
        return Row(
            "2. `retriever build --corpus P/corpus.jsonl --out P` (P a user's folder with a `meta.json`; P an index)",
            f"user's P: rc {in_user.rc}; index P with --overwrite: rc {in_index.rc}: {self._said(in_index.out, 90)}; "
            + ("both corpora kept byte for byte (url fields and titles)" if kept else "**a corpus was rewritten**"),
            built.rc == 0
            and one_line(in_user.out, in_user.rc, str(data))
            and one_line(in_index.out, in_index.rc, "inside --out")
            and kept,
        )

    def build_over_another_corpus_index(self) -> Row:
        index = self.work / "own_idx3"
        a = _corpus(self.work / "own_a.jsonl", PASSAGES)
        b = _corpus(self.work / "own_b.jsonl", [{"id": "b", "contents": "another corpus"}])
        built = pvpo("retriever", "build", "--corpus", str(a), "--out", str(index), "--index-type", "bm25")
        before = snapshot(index)
        plain = pvpo("retriever", "build", "--corpus", str(b), "--out", str(index))
        kept = snapshot(index) == before
        over = pvpo("retriever", "build", "--corpus", str(b), "--out", str(index), "--index-type", "bm25",
                    "--overwrite")  # fmt: skip
        size = json.loads((index / "meta.json").read_text())["size"] if over.rc == 0 else None
        return Row(
            "3. `retriever build --corpus b.jsonl --out I`, I a finished index of another corpus",
            f"rc {plain.rc}: {self._said(plain.out, 110)}; "
            + ("kept byte for byte" if kept else "**replaced**")
            + f"; with --overwrite: rc {over.rc}, {size} passage(s)",
            built.rc == 0 and one_line(plain.out, plain.rc, "already holds a finished index") and kept and size == 1,
        )

    # ---- the trainer's index dir, pruning, demo vs train (items 4, 5, 7) --------------------------
    def train_index_dir_a_users_folder(self) -> Row:
        data = self._users_data("own_data4", meta=False)
        before = snapshot(data)
        run = self.work / "own_run4"
        res = pvpo("train", "--config", SMOKE, "--run-dir", str(run), f"retriever.index_dir={data}")
        kept = snapshot(data) == before
        return Row(
            "4. `pvpo train ... retriever.index_dir=DATA`, DATA a user's folder (corpus.jsonl, embeddings/)",
            f"rc {res.rc} in {res.seconds:.1f} s: {self._said(res.out, 110)}; "
            + ("DATA kept byte for byte" if kept else "**DATA changed**")
            + ("; no run dir written" if not run.exists() else "; a run dir was written"),
            one_line(res.out, res.rc, "retriever.index_dir") and kept and not run.exists(),
        )

    def pruning_keeps_a_users_copy(self) -> Row:
        run = self.copy_run("own_prune")
        ckpts = run / "checkpoints"
        shutil.copytree(ckpts / "step_000002", ckpts / "step_000002_good")
        good = snapshot(ckpts / "step_000002_good")
        res = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=5", "run.checkpoint_every=1")
        names = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_"))
        kept = (ckpts / "step_000002_good").is_dir() and snapshot(ckpts / "step_000002_good") == good
        return Row(
            "5. a user's copy `checkpoints/step_000002_good`, then a resume whose checkpoints prune the old ones",
            f"rc {res.rc}; checkpoints after: {', '.join(names)}; "
            + ("the copy kept byte for byte" if kept else "**the copy is gone**"),
            res.rc == 0 and kept and "step_000005" in names and "step_000002" not in names,
        )

    def demo_into_a_training_run(self) -> Row:
        run = self.copy_run("own_demo")
        before = snapshot(run)
        res = pvpo("demo", "--config", "smoke", "--run-dir", str(run))
        kept = snapshot(run) == before
        defaults = python(
            "import inspect; from pathlib import Path; from pvpo.recipes.cli import demo_cmd; from pvpo.trainer.cli import default_run_dir; "
            "print(default_run_dir(Path('demo')), inspect.signature(demo_cmd).parameters['run_dir'].default)"
        )
        train_default, demo_default = (defaults.out.split() + ["?", "?"])[:2]
        return Row(
            "7. `pvpo train --config smoke --run-dir R`, then `pvpo demo --config smoke --run-dir R`; the defaults",
            f"rc {res.rc}: {self._said(res.out, 100)}; "
            + ("the run kept byte for byte" if kept else "**the run changed**")
            + f"; defaults: train --config demo -> {train_default}, demo -> {demo_default}",
            one_line(res.out, res.rc, "training run") and kept and train_default != demo_default,
        )

    # ---- output files (items 6 and 8) -----------------------------------------------------------
    def _eval_folder(self) -> Path:
        """A real evaluation of one question with the smoke run's policy: `work/own_eval/own`."""
        out = self.work / "own_eval"
        if not (out / "own" / "predictions.jsonl").exists():
            data = self.dataset("own/questions.jsonl", jsonl([{"id": "1", "question": "q?", "golden_answers": ["a"]}]))
            res = pvpo(*self.eval_args(data, "own_eval"))
            if res.rc != 0:
                raise RuntimeError(f"the evaluation the probe views failed: {first_error(res.out)}")
        return out / "own"

    def view_onto_a_runs_files(self) -> Row:
        toy = self._eval_folder()
        run = self.copy_run("own_view")
        results, ok = [], True
        for target in (toy / "predictions.jsonl", run / "config.yaml"):
            before = snapshot(toy) | snapshot(run)
            for extra in ([], ["--overwrite"]):
                res = pvpo("view", str(toy), "--out", str(target), *extra)
                ok = ok and one_line(res.out, res.rc, "give another path") and snapshot(toy) | snapshot(run) == before
                results.append(res.rc)
        resumed = pvpo("train", "--run-dir", str(run), "--resume", "run.steps=3")
        return Row(
            "6. `pvpo view OUT/toy --out OUT/toy/predictions.jsonl`, `--out RUN/config.yaml` (with and without "
            "--overwrite)",
            f"rc {', '.join(map(str, results))}: {self._said(res.out, 80)}; files kept; the run resumes: rc {resumed.rc}",
            ok and resumed.rc == 0,
        )

    def outputs_onto_a_users_files(self) -> Row:
        toy = self._eval_folder()
        files = {name: self.work / "own_user" / name for name in ("thesis.txt", "notes.md", "table.csv")}
        for f in files.values():
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(NOTES)
        view = pvpo("view", str(toy), "--out", str(files["thesis.txt"]))
        report = pvpo("eval", "report", str(toy), "--md", str(files["notes.md"]), "--csv", str(files["table.csv"]))
        kept = all(f.read_bytes() == NOTES for f in files.values())
        over = pvpo("eval", "report", str(toy), "--md", str(files["notes.md"]), "--overwrite")
        return Row(
            "8. `pvpo view ... --out thesis.txt`, `eval report ... --md notes.md --csv table.csv` (existing files)",
            f"view rc {view.rc}, report rc {report.rc}: {self._said(report.out, 90)}; "
            + ("kept byte for byte" if kept else "**overwritten**")
            + f"; with --overwrite: rc {over.rc}",
            one_line(view.out, view.rc, "--overwrite")
            and one_line(report.out, report.rc, "--overwrite")
            and kept
            and over.rc == 0
            and files["notes.md"].read_bytes() != NOTES,
        )

    # ---- --overwrite (item 9) -------------------------------------------------------------------
    def overwrite_with_nested_user_files(self) -> Row:
        run = self.copy_run("own_nested")
        (run / "checkpoints" / "README").write_bytes(NOTES)
        (run / "checkpoints" / "step_000002" / "NOTES.md").write_bytes(NOTES)
        before = snapshot(run)
        res = pvpo("train", "--config", SMOKE, "--run-dir", str(run), "--overwrite")
        kept = snapshot(run) == before
        return Row(
            "9. `pvpo train --overwrite` with a user's `checkpoints/README` and `checkpoints/step_000002/NOTES.md`",
            f"rc {res.rc} in {res.seconds:.1f} s: {self._said(res.out, 110)}; "
            + ("every file kept byte for byte" if kept else "**files changed**"),
            one_line(res.out, res.rc, "move it out") and kept,
        )

    def eval_onto_a_users_run_json(self) -> Row:
        data = self.dataset("own9/questions.jsonl", jsonl([{"id": "1", "question": "q?", "golden_answers": ["a"]}]))
        place = self.work / "own_eval9" / "own9"
        place.mkdir(parents=True)
        (place / "run.json").write_bytes(b'{"my": "experiment log"}\n')
        before = snapshot(place)
        res = pvpo(*self.eval_args(data, "own_eval9"), "--overwrite")
        kept = snapshot(place) == before
        return Row(
            "9. `pvpo eval --out O --overwrite`, O/<dataset>/ holding only a user's `run.json`",
            f"rc {res.rc}: {self._said(res.out, 110)}; " + ("kept byte for byte" if kept else "**replaced**"),
            one_line(res.out, res.rc, "run.json") and kept,
        )

    def rows(self) -> list[Row]:
        """Every probe of this module, in the issue's order (needs the smoke run and `url`)."""
        return run_probes(
            [
                self.build_into_a_users_folder,
                self.build_onto_its_own_corpus,
                self.build_over_another_corpus_index,
                self.train_index_dir_a_users_folder,
                self.pruning_keeps_a_users_copy,
                self.view_onto_a_runs_files,
                self.demo_into_a_training_run,
                self.outputs_onto_a_users_files,
                self.overwrite_with_nested_user_files,
                self.eval_onto_a_users_run_json,
            ]
        )


def main() -> None:
    """These probes alone: the smoke run trained and its index served first; exit 1 if one fails."""
    work = Path(tempfile.mkdtemp(prefix="pvpo-faults-ownership-"))
    probes = Ownership(work)
    smoke = pvpo("train", "--config", SMOKE, "--run-dir", str(probes.base))
    setup = Row("`configs/smoke.yaml`, the run the probes copy", f"rc {smoke.rc}, {smoke.seconds:.0f} s", smoke.rc == 0)
    port = free_port()
    server = serve_index(probes.base / "index", port)
    probes.url = f"http://127.0.0.1:{port}"
    try:
        rows = [setup, *probes.rows()]
    finally:
        stop(server)
        shutil.rmtree(work, ignore_errors=True)
    print_alone(rows, work)


if __name__ == "__main__":
    main()
