"""The run folder (``--output``): what a run may create, replace and delete there, and nothing else.

A run writes only files a run makes, by exact name: :data:`RUN_FILES` in the folder, :data:`MODEL_FILES` in the folder
of each of its runs. It never follows a symbolic link out of the folder: a file is written to a temporary beside it,
created with ``O_EXCL`` (``tempfile.mkstemp``), then renamed over it (a kill never leaves half a file, and a link in
its place is replaced, not written through); the lock is opened with ``O_NOFOLLOW``; a run's folder that is a link
or a file is refused before anything is written.
"""

import csv
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock, so no lock (two runs on one folder are then the user's to avoid)
    fcntl = None

__all__ = ["MODEL_FILES", "RESULT_FILES", "RUN_FILES", "append_csv", "atomic_write", "check_output", "drop_log_rows",
           "locked", "remove_run_files", "run_folder", "write_csv", "write_json"]  # fmt: skip

RESULT_FILES = ("results.csv", "results.md", "accuracy_vs_resolution.png", "extrapolation.png")
RUN_FILES = ("config.yaml", "log.csv", *RESULT_FILES)
MODEL_FILES = ("checkpoint.pt", "model.safetensors", "results.json")
LOCK = ".lock"


def check_output(output: str) -> Path:
    """``--output`` resolved, or one line where it cannot hold a run: an empty name, a system folder (the root, a
    folder right under it, the home folder), a file, a folder this process cannot write."""
    if not output.strip():
        raise SystemExit("error: --output is empty; name a folder for the run's files, e.g. --output runs/mine")
    path = Path(output).expanduser().resolve()
    if len(path.parts) <= 2 or path == Path.home().resolve():
        raise SystemExit(
            f"error: --output {output!r} is {path}, a system folder; name a folder of the run's own, e.g. runs/mine"
        )
    if path.exists() and not path.is_dir():
        raise SystemExit(f"error: --output {output!r} is a file, not a folder; name a folder for the run's files")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f"error: --output {output!r}: {existing} is not writable by this user; choose another folder")
    return path


def run_folder(out: Path, tag: str) -> Path:
    """A run's folder: its tag made filesystem-safe (``name:k=v@recipe@seed1`` → ``name__k=v@recipe@seed1``); one
    line where something other than a folder (a link, a file) stands there."""
    path = out / re.sub(r"[^\w.=@-]", "_", tag.replace(":", "__"))
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        kind = "a symbolic link" if path.is_symlink() else "a file"
        raise SystemExit(
            f"error: {path} is {kind}, where run {tag} keeps its files; remove it, or use another --output"
        )
    return path


def atomic_write(path: Path, write: Callable[[object, str], None], obj: object) -> None:
    """``write(obj, tmp)`` to a new temporary file beside ``path``, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(obj, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` while the run writes there; a second run on the folder stops with a clear error. The
    OS releases a flock when its process dies, so a killed run leaves no stale lock."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise SystemExit(
            f"error: cannot open the lock {folder / LOCK} ({e.strerror}); a run's lock is a plain file it makes: "
            "remove what stands there"
        ) from None
    with os.fdopen(fd, "r+") as f:
        if fcntl is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = f.read().strip() or "another process"
                raise SystemExit(
                    f"error: {folder} is in use by another run ({holder}); wait for it to end, or choose another "
                    "--output"
                ) from None
        f.truncate(0)
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        yield  # closing the file releases the lock


def remove_run_files(out: Path, folders: Sequence[Path], files: Sequence[str], keep: Path | None = None) -> None:
    """Delete the files a run makes, by name: ``files`` in ``out`` and :data:`MODEL_FILES` in each of ``folders``
    (links are removed, never followed; anything else there stays, and so does ``keep``)."""
    for path in [*(out / f for f in files), *(d / f for d in folders for f in MODEL_FILES)]:
        if (path.is_symlink() or path.is_file()) and not (keep is not None and path.resolve() == keep):
            path.unlink()


# ---------------------------------------------------------------------------------------------------- files
def write_json(obj: object, path: str) -> None:
    Path(path).write_text(json.dumps(obj))


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def append_csv(path: Path, row: dict) -> None:
    """One row appended to a CSV file (with its header if the file is new), through a rewrite of the whole file, so
    that a link in its place is replaced rather than written through."""
    rows = read_csv(path) if path.is_file() and not path.is_symlink() else []
    atomic_write(path, write_csv, [*rows, row])


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def drop_log_rows(path: Path, tag: str, after: int) -> None:
    """Forget ``tag``'s log rows past epoch ``after``: a kill between appending a row and writing the checkpoint
    leaves a row for an epoch that the resumed run trains (and logs) again."""
    if not path.is_file() or path.is_symlink():
        return
    rows = read_csv(path)
    keep = [r for r in rows if not (r["model"] == tag and int(r["epoch"]) > after)]
    if not keep:
        path.unlink()  # append_csv writes the header again
    elif len(keep) < len(rows):
        atomic_write(path, write_csv, keep)
