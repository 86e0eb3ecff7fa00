"""pvpo's one rule for the folders it writes (`pvpo.owned`): only what pvpo wrote in a folder it
recorded as its own may be replaced; a user's file is kept with or without --overwrite; a
replacement that fails, is stopped, or is cut by a SIGKILL is put back, and only a committed one
is ever dropped."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from pvpo.locks import folder_lock, lock_path
from pvpo.owned import (
    ASIDE,
    DROPPING,
    RECORD,
    FolderError,
    FolderKind,
    check_folder_path,
    claim,
    commit,
    is_ours,
    move_aside,
    recover,
    replacing,
)
from pvpo.signals import hold_signals, stop_on_signals

KIND = FolderKind("thing", "a thing", frozenset({"out.json", "parts"}))


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def _earlier(tmp_path: Path) -> Path:
    """A folder of KIND's (its manifest written first) with an earlier result and a user's thesis.txt."""
    folder = tmp_path / "f"
    claim(folder, KIND)
    (folder / "parts").mkdir(parents=True)
    (folder / "out.json").write_text("old")
    (folder / "parts" / "a").write_text("old part")
    (folder / "thesis.txt").write_text("mine")
    return folder


def test_overwrite_replaces_only_what_pvpo_wrote_and_keeps_a_users_file(tmp_path: Path) -> None:
    folder = _earlier(tmp_path)
    with pytest.raises(FolderError, match="already holds a thing.*pass --again"):
        with replacing(folder, KIND, overwrite=False, refusal="pass --again"):
            pass
    with replacing(folder, KIND, overwrite=True, refusal="") as replacement:
        assert (folder / "thesis.txt").read_text() == "mine" and (folder / ASIDE / "out.json").exists()
        (folder / "out.json").write_text("new")
        replacement.commit()
    assert _files(folder) == {RECORD: (folder / RECORD).read_text(), "out.json": "new", "thesis.txt": "mine"}


def test_a_replacement_that_fails_or_is_stopped_before_its_commit_puts_everything_back(tmp_path: Path) -> None:
    folder = _earlier(tmp_path)
    before = {k: v for k, v in _files(folder).items() if k != RECORD}
    for stop in (ValueError("bad input"), KeyboardInterrupt()):
        with pytest.raises(type(stop)), replacing(folder, KIND, overwrite=True, refusal=""):
            (folder / "out.json").write_text("half")
            (folder / "parts").mkdir()
            raise stop
        assert {k: v for k, v in _files(folder).items() if k != RECORD} == before
        assert not (folder / ASIDE).exists()


def test_a_replacement_cut_by_a_kill_is_put_back_by_the_next_command_and_a_committed_one_is_dropped(
    tmp_path: Path,
) -> None:
    folder = _earlier(tmp_path)
    claim(folder, KIND)  # what `replacing` does before it moves anything
    before = _files(folder)
    # a SIGKILL after the moves, while the new content was being written: nothing committed
    move_aside(folder, ["out.json", "parts"])
    (folder / "out.json").write_text("new, never committed")
    assert recover(folder, KIND) is not None
    assert _files(folder) == before and not (folder / ASIDE).exists()
    # a SIGKILL half way through the moves: what was moved comes back, what was not stays
    (folder / ASIDE).mkdir()
    (folder / ASIDE / "moved.json").write_text('["out.json", "parts"]')
    os.replace(folder / "out.json", folder / ASIDE / "out.json")
    recover(folder, KIND)
    assert _files(folder) == before
    # a SIGKILL in the middle of dropping a committed replacement: the rest of it goes
    move_aside(folder, ["parts"])
    commit_dir = folder / DROPPING
    os.replace(folder / ASIDE, commit_dir)
    recover(folder, KIND)
    assert not commit_dir.exists() and not (folder / "parts").exists() and (folder / "thesis.txt").exists()


def test_a_users_entry_bearing_a_name_pvpo_writes_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "out.json").write_text("the user's own")
    (folder / "parts").mkdir()
    kind = FolderKind("thing", "a thing", frozenset({"out.json", "parts"}))  # no manifest: the user's
    assert not is_ours(folder, kind)
    with (
        pytest.raises(FolderError, match="pvpo did not write there"),
        replacing(folder, kind, overwrite=True, refusal=""),
    ):
        pass
    assert (folder / "out.json").read_text() == "the user's own"


def test_a_start_refused_or_failed_before_writing_leaves_no_record_in_a_users_folder(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.txt").write_text("mine")
    with pytest.raises(ValueError, match="bad"), replacing(folder, KIND, overwrite=True, refusal=""):
        raise ValueError("bad config")
    assert sorted(p.name for p in folder.iterdir()) == ["thesis.txt"]
    with pytest.raises(ValueError), replacing(tmp_path / "new", KIND, overwrite=False, refusal=""):
        raise ValueError("bad")
    assert not (tmp_path / "new").exists()


def test_a_signal_during_the_moves_waits_for_them_then_stops_the_command_once(tmp_path: Path) -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), stop_on_signals():
        with hold_signals():
            for _ in range(5):
                os.kill(os.getpid(), signal.SIGINT)
            done.append("moved")
        done.append("after")  # the held signal stops the command here
    assert done == ["moved"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back after the block


def test_paths_a_folder_cannot_be_written_at_are_one_line_errors(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    with pytest.raises(FolderError, match="loop"):
        check_folder_path(loop, "--run-dir")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FolderError, match="is a file"):
        check_folder_path(tmp_path / "file", "--out")
    with pytest.raises(FolderError, match="is a file, not a folder"):
        check_folder_path(tmp_path / "file" / "sub", "--out")


def test_a_folder_name_of_250_characters_gets_a_lock_file_name_the_file_system_takes(tmp_path: Path) -> None:
    long = tmp_path / ("r" * 250)
    assert len(lock_path(long).name.encode()) <= 255
    assert lock_path(long) != lock_path(tmp_path / ("r" * 249 + "s"))  # two long names, two locks
    with folder_lock(long, "test"):
        assert lock_path(long).exists()


def test_recover_touches_nothing_in_a_folder_that_is_not_pvpos(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    (folder / ASIDE).mkdir(parents=True)  # the user's own folders, of names pvpo uses in its own
    (folder / ASIDE / "keep.txt").write_text("mine")
    (folder / DROPPING).mkdir()
    (folder / DROPPING / "keep.txt").write_text("mine")
    assert recover(folder, KIND) is None
    assert _files(folder) == {f"{ASIDE}/keep.txt": "mine", f"{DROPPING}/keep.txt": "mine"}


def test_a_damaged_list_of_moved_entries_still_puts_every_moved_entry_back(tmp_path: Path) -> None:
    folder = _earlier(tmp_path)
    claim(folder, KIND)
    before = _files(folder)
    move_aside(folder, ["out.json", "parts"])
    (folder / ASIDE / "moved.json").write_text('["out.js')  # torn
    (folder / "out.json").write_text("new")
    recover(folder, KIND)
    assert _files(folder) == before


def test_a_committed_replacement_is_dropped_and_its_aside_never_put_back(tmp_path: Path) -> None:
    folder = _earlier(tmp_path)
    move_aside(folder, ["out.json"])
    (folder / "out.json").write_text("new")
    commit(folder)
    assert recover(folder, KIND) is None
    assert (folder / "out.json").read_text() == "new" and (folder / "thesis.txt").read_text() == "mine"
