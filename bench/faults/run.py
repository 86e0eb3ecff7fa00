"""The fault table: bad input and faults tried as a user would, through the `pvpo` CLI, each
checked for its outcome (rc 2 and a one-line message naming the file, the key or the PID, or the
warning) and for the user's files it must not lose. One module per group of probes, named by what
it probes, and this runner for all; `--rounds` selects groups by the number of the table's round
that added them (the page's tables keep those titles):

- round 1 (`stops_outages.py`): stops, retriever outages, hostile clients, bad keys, bad data,
  configs and checkpoints;
- round 2 (`concurrency_disk.py`): two processes on one folder, a full or read-only disk, damaged
  files, stop signals;
- round 3 (`hostile_user.py`): a user's files in the folders pvpo writes, Ctrl-C storms,
  colliding dataset names, secrets, reward-parameter typos, a YAML bomb, over-long queries,
  damaged state, odd paths;
- round 4, secrets and bad input (`secrets_input.py`): URL passwords holding `@` or `/`, a
  `--debug` traceback of a 401, a malformed URL, a reply of the wrong shape, a damaged metrics.json,
  reward parameters out of range, a lone surrogate in a query, a full `/retrieve` URL;
- round 4, a user's files (`ownership.py`): `retriever build` into a user's folder, onto its
  own corpus, over another corpus's index; a user's folder as the trainer's index dir; a user's
  checkpoint copy at pruning; `view --out` / `eval report --md` onto a run's or a user's files; a
  demo into a training run; `--overwrite` with user files nested in `checkpoints/`;
- round 4, the viewer (`viewer.py`): `view --serve` asked for another host or on a busy
  port, damaged lines, a YAML alias bomb in a run's config, a 6.6 MB response of one search repeated.

    python bench/faults/run.py [--workdir DIR] [--keep] [--rounds 1,2,3,4] [--docs docs/reliability.md]

Everything runs offline on CPU in a scratch folder: one smoke run (configs/smoke.yaml) gives the
checkpoints, policy and index the other faults use; a loopback retriever serves that index. It
prints the tables; `--docs` also writes them, with the command, machine, versions and commit,
into the documentation's reliability page below its marker line. A probe that cannot run here
(a tmpfs needs root) is "not run": the total counts the probes that ran.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.faults.concurrency_disk import ConcurrencyDisk
from bench.faults.hostile_user import HostileUser
from bench.faults.ownership import Ownership
from bench.faults.probes import Row, free_port, serve_index, table, total
from bench.faults.secrets_input import SecretsInput
from bench.faults.stops_outages import StopsOutages
from bench.faults.viewer import ViewerInput
from pvpo.machine import machine_line

MARKER = "<!-- bench/faults/run.py --docs writes everything below this line -->"


def write_docs(path: Path, body: str) -> None:
    """Replace everything below MARKER in `path` with `body`."""
    text = path.read_text()
    if MARKER not in text:
        raise SystemExit(f"{path} has no line {MARKER!r} to write below")
    path.write_text(text.split(MARKER, 1)[0] + MARKER + "\n\n" + body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a new temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--rounds", default="1,2,3,4", help="the rounds to run, e.g. 3 or 1,2,3,4")
    parser.add_argument("--docs", type=Path, default=None, help="write the tables into this page below its marker")
    args = parser.parse_args()
    rounds = {int(r) for r in args.rounds.split(",")}
    work = args.workdir or Path(tempfile.mkdtemp(prefix="pvpo-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    one = StopsOutages(work)
    setup = one.smoke_run()
    port = free_port()
    server = serve_index(one.base / "index", port)
    url = f"http://127.0.0.1:{port}"
    one.url = url
    tables: list[tuple[str, list[Row]]] = []
    try:
        if 1 in rounds:
            tables.append(("First round: stops, outages, hostile clients, bad keys", one.held_rows(server)))
            tables.append(("First round: bad data, configs and checkpoints", [setup, *one.data_rows()]))
        else:
            tables.append(("Setup", [setup]))
        if 2 in rounds:
            tables.append(
                (
                    "Second round: two processes, a full disk, a damaged file, a stop signal",
                    ConcurrencyDisk(work, url).rows(),
                )
            )
        if 3 in rounds:
            tables.append(
                (
                    "Third round: a user's files, Ctrl-C storms, names, secrets, typos, bombs, damaged state, odd paths",
                    HostileUser(work, url).rows(server),
                )
            )
        if 4 in rounds:
            tables.append(("Fourth round: secrets and bad input", SecretsInput(work, url).rows()))
            tables.append(("Fourth round: a user's files, output flags, default folders", Ownership(work, url).rows()))
            tables.append(("Fourth round: the viewer's server and bad input", ViewerInput(work, url).rows()))
    finally:
        server.terminate()
        server.wait()
    if 1 in rounds:  # each starts and kills a retriever of its own
        tables[0][1].extend(one.outage_rows())
    every = [r for _, rows in tables for r in rows]
    command = "PYTHONPATH=$PWD HF_HUB_OFFLINE=1 nice -n 19 python " + shlex.join(["bench/faults/run.py", *sys.argv[1:]])
    text = "\n".join(table(title, rows, work) for title, rows in tables)
    summary = (
        f"$W = the scratch folder. {total(every)}; {time.perf_counter() - t0:.0f} s, load average {load0} at start, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at end."
    )
    print(f"\n{text}\n{summary}")
    if args.docs is not None:
        write_docs(
            args.docs,
            f"Measured with `{command}` on {machine_line(('torch', 'transformers', 'faiss-cpu'))}, {time.strftime('%Y-%m-%d')} (the cores shared with other "
            "jobs: the load average is in the last line; times are wall clock under that load).\n\n"
            f"{text}\n{summary}\n",
        )
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if all(r.ok is not False for r in every) else 1)


if __name__ == "__main__":
    main()
