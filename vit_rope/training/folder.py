"""The run folder (``--output``): what a run may create, replace and delete there, and nothing else.

A run writes only files a run makes, by exact name: :data:`RUN_FILES` in the folder, :data:`MODEL_FILES` in the folder
of each of its runs, each a child of ``--output`` whatever file named it. It never follows a symbolic link: every file
is written by :func:`atomic_write` (a temporary created with ``O_EXCL | O_NOFOLLOW`` in the folder opened without
following a link, then renamed over the file, so that a kill never leaves half a file and a link planted in its place,
or in the place of its folder, is replaced or refused, never written through); what a run reads back of its own it reads
with :func:`read_own` (a regular file, no link); the lock is opened with ``O_NOFOLLOW``; a run's folder that is a link
or a file is refused before anything is written.
"""

import csv
import errno
import io
import json
import math
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no flock, so no lock (two runs on one folder are then the user's to avoid)
    fcntl = None

__all__ = ["DISK_FULL", "MODEL_FILES", "RESULT_FILES", "RUN_FILES", "append_csv", "atomic_write", "check_output",
           "check_own_files", "disk_error", "drop_log_rows", "locked", "made", "read_log", "read_own",
           "remove_run_files", "run_folder", "write_csv", "write_json"]  # fmt: skip

RESULT_FILES = ("results.csv", "results.md", "accuracy_vs_resolution.png", "extrapolation.png", "overview.png")
RUN_FILES = ("config.yaml", "log.csv", *RESULT_FILES)
MODEL_FILES = ("checkpoint.pt", "model.safetensors", "config.json", "results.json")  # config.json: timm's, of the model
LOCK = ".lock"
LOG_FIELDS = ("model", "epoch", "train_loss", "train_top1", "val_loss", "val_top1", "lr", "seconds")
_DIR_FD = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd  # (os.replace: renameat too)


def check_output(output: str) -> Path:
    """``--output`` resolved, or one line where it cannot hold a run: an empty name, a system folder (the root, a
    folder right under it, the home folder), a file, a folder this process cannot write."""
    if not output.strip():
        raise SystemExit("error: --output is empty; name a folder for the run's files, e.g. --output runs/mine")
    if "\0" in output:
        raise SystemExit(f"error: --output {output!r} holds a NUL character, which no path may; name a folder")
    path = Path(output).expanduser().resolve()
    if len(path.parts) <= 2 or path == Path.home().resolve():
        raise SystemExit(
            f"error: --output {output!r} is {path}, a system folder; name a folder of the run's own, e.g. runs/mine"
        )
    if path.exists() and not path.is_dir():
        raise SystemExit(f"error: --output {output!r} is a file, not a folder; name a folder for the run's files")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():  # a file (or FIFO) where a folder above --output must be
        raise SystemExit(f"error: --output {output!r}: {existing} is not a folder; choose another --output")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f"error: --output {output!r}: {existing} is not writable by this user; choose another folder")
    return path


# a run's folder name: one plain path component of the characters below, never "." or ".." (nor hidden, so that it
# cannot be the lock or a temporary), short enough for every filesystem (255 bytes)
MAX_NAME = 255


def run_folder(out: Path, tag: str) -> Path:
    """A run's folder: its tag made filesystem-safe (``name:k=v@recipe@seed1`` → ``name__k=v@recipe@seed1``); one
    line where the name is not one plain folder name (``..``, too long), or where something other than a folder (a
    link, a file) stands there. The tag may come from a file the run did not write (an earlier run's config.yaml):
    whatever it says, the folder is a child of ``out``."""
    name = re.sub(r"[^\w.=@-]", "_", tag.replace(":", "__"))
    if not name or name.startswith(".") or len(name.encode()) > MAX_NAME:
        why = "too long for a folder name" if len(name.encode()) > MAX_NAME else "not a plain folder name"
        raise SystemExit(
            f"error: run {tag!r} would keep its files in {name!r}, which is {why} (names begin with a letter, digit "
            f"or '_' and have at most {MAX_NAME} bytes); rename the model or recipe"
        )
    path = out / name
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        kind = "a symbolic link" if path.is_symlink() else "a file"
        raise SystemExit(
            f"error: {path} is {kind}, where run {tag} keeps its files; remove it, or use another --output"
        )
    return path


# ----------------------------------------------------------------------------- writing and reading without links
def _no_link(folder: Path) -> SystemExit:
    return SystemExit(
        f"error: {folder} is not a folder of the run's own any more (a symbolic link or another file stands there); "
        "nothing was written through it: remove it, then --resume"
    )


def open_folder(folder: Path) -> int:
    """A descriptor of ``folder`` opened without following a link in its place (its parent is the run's folder or
    --output resolved): what is written in it lands in the folder checked, even if a link is planted meanwhile."""
    parent = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return os.open(folder.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError:  # ELOOP (a link) or ENOTDIR (a file): never entered
        raise _no_link(folder) from None
    finally:
        os.close(parent)


# what a full or failing disk raises while a file is written: one line naming the file (the files written before it
# are whole, the temporary is removed), never a traceback through whichever writer ran
DISK_FULL = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system",
             errno.EIO: "input/output error", errno.EFBIG: "file too large"}  # fmt: skip


def disk_error(path: Path, e: OSError) -> SystemExit:
    return SystemExit(
        f"error: {DISK_FULL[e.errno]} writing {path}; the files written before it are whole: free space (or fix the "
        "disk), then --resume continues from the last finished epoch"
    )


def atomic_write(path: Path, write: Callable[[object, BinaryIO], None], obj: object) -> None:
    """``write(obj, f)`` into a new temporary file beside ``path`` (created with ``O_EXCL | O_NOFOLLOW`` in the folder
    opened without following links), flushed to disk, then renamed over ``path``: a kill leaves the old file or the
    new one, never half of one, and a link or FIFO in ``path``'s place is replaced, never written through. A full
    disk (ENOSPC, EDQUOT), a read-only one (EROFS) or an I/O error is one line naming ``path`` (:data:`DISK_FULL`),
    the temporary removed and the old file kept."""
    try:
        _atomic_write(path, write, obj)
    except OSError as e:
        if e.errno in DISK_FULL:
            raise disk_error(path, e) from None
        raise


def _atomic_write(path: Path, write: Callable[[object, BinaryIO], None], obj: object) -> None:
    if not _DIR_FD:  # no dir_fd (Windows): by path, which the checks before the run have made safe
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                write(obj, f)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return
    folder = open_folder(path.parent)
    tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o644)
                write(obj, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException as e:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            if isinstance(e, IsADirectoryError | NotADirectoryError | PermissionError):
                raise SystemExit(
                    f"error: cannot write {path} ({e.strerror}): something other than a file of the run stands there; "
                    "remove it, then --resume"
                ) from None
            raise
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)


def read_own(path: Path, what: str, remedy: str, expected: str = "a file the run wrote") -> bytes | None:
    """The bytes of a file a run wrote and reads back (None where there is none), opened without following a link and
    only if it is a regular file: a link (to another run's file, say), a FIFO (which would block), a device or a
    folder in its place is one line naming it, what it should be (``expected``) and ``remedy``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        kind = "a symbolic link" if path.is_symlink() else f"unreadable ({e.strerror})"
        raise SystemExit(f"error: {what} {path} is {kind}, not {expected}; {remedy}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # (before fdopen, which refuses a folder with a traceback)
        os.close(fd)
        kind = file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
        raise SystemExit(f"error: {what} {path} is {kind}, not {expected}; {remedy}")
    with os.fdopen(fd, "rb") as f:
        return f.read()


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    for test, kind in kinds:
        if test(mode):
            return kind
    return "not a regular file"


def check_own_files(out: Path, folders: Sequence[Path]) -> None:
    """Where a run will write its files (:data:`RUN_FILES` in ``out``, :data:`MODEL_FILES` in each folder) stands a
    regular file, a link (replaced, never followed) or nothing: a folder, FIFO or device there is one line now,
    before anything changes, rather than a failed rename after an epoch of training."""
    for path in [*(out / f for f in RUN_FILES), *(d / f for d in folders for f in MODEL_FILES)]:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise SystemExit(
                f"error: {path} is {file_kind(mode)}, where the run writes its file {path.name}; remove it, or choose "
                "another --output"
            )


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` while the run writes there; a second run on the folder stops with a clear error. The
    OS releases a flock when its process dies, so a killed run leaves no stale lock."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno in DISK_FULL:
            raise disk_error(folder, e) from None
        raise
    refused = "a run's lock is a plain file it makes: remove what stands there"
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise SystemExit(f"error: cannot open the lock {folder / LOCK} ({e.strerror}); {refused}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device planted there: no lock to hold, nothing to truncate
        os.close(fd)
        raise SystemExit(f"error: the lock {folder / LOCK} is {file_kind(st.st_mode)}; {refused}")
    if st.st_nlink > 1:  # a hard link: the same file lies elsewhere too, outside the run's reach (O_NOFOLLOW
        os.close(fd)  # stops symbolic links only); writing the pid would write there
        raise SystemExit(
            f"error: the lock {folder / LOCK} has {st.st_nlink} hard links, so it is not the run's own; {refused}"
        )
    with os.fdopen(fd, "r+") as f:
        if fcntl is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = f.read(200).strip() or "another process"
                raise SystemExit(
                    f"error: {folder} is in use by another run ({holder}); wait for it to end, or choose another "
                    "--output"
                ) from None
        try:
            f.truncate(0)
            f.write(f"pid {os.getpid()}\n")
            f.flush()
        except OSError as e:
            if e.errno in DISK_FULL:
                raise disk_error(folder / LOCK, e) from None
            raise
        yield  # closing the file releases the lock


def remove_run_files(out: Path, folders: Sequence[Path], files: Sequence[str], keep: Path | None = None) -> None:
    """Delete the files a run makes, by name: ``files`` in ``out`` and :data:`MODEL_FILES` in each of ``folders``
    (children of ``out`` only). Each folder is entered without following a link, and only a regular file or a link
    is removed (a link is removed, never followed); anything else there stays, and so does ``keep``."""
    keep_id = (keep.stat().st_dev, keep.stat().st_ino) if keep is not None and keep.is_file() else None
    for folder, names in [(out, files), *((d, MODEL_FILES) for d in folders)]:
        if folder != out and (folder.parent != out or folder.name in ("", ".", "..")):
            continue  # never outside --output, whatever named the folder
        if not _DIR_FD:
            for name in names:
                path = folder / name
                if (path.is_symlink() or path.is_file()) and not (keep is not None and path.resolve() == keep):
                    path.unlink()
            continue
        try:
            fd = open_folder(folder)
        except (FileNotFoundError, SystemExit):  # no folder, or a link in its place: nothing of the run's in it
            continue
        try:
            for name in names:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) != keep_id):
                    os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------------- files
def write_json(obj: object, f: BinaryIO) -> None:
    f.write(json.dumps(obj).encode())


def write_csv(rows: list[dict], f: BinaryIO) -> None:
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    f.write(text.getvalue().encode())


def append_csv(path: Path, row: dict) -> None:
    """One row appended to the log (with its header if the file is new), through a rewrite of the whole file, so
    that a link in its place is replaced rather than written through."""
    atomic_write(path, write_csv, [*read_log(path), row])


LOG_REMEDY = "delete it (a run resumes without its log, which then lacks the earlier epochs) or choose another --output"


def read_log(path: Path) -> list[dict]:
    """A run's log.csv, each row checked: the columns train.py writes, a model tag, an epoch (a whole number of at
    least 1) and finite numbers; [] where there is none. A damaged or forged log is one line naming the row."""
    data = read_own(path, "the log", LOG_REMEDY)
    if data is None:
        return []
    try:
        rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as e:
        raise SystemExit(f"error: the log {path} cannot be read as CSV ({e}); {LOG_REMEDY}") from None
    for i, r in enumerate(rows, 2):  # line 1 is the header
        problem = log_row_problem(r)
        if problem:
            raise SystemExit(f"error: the log {path} is damaged at line {i}: {problem}; {LOG_REMEDY}")
    return rows


def log_row_problem(row: dict) -> str:
    """What is wrong with one row of log.csv ('' if nothing)."""
    if tuple(row) != LOG_FIELDS or None in row.values():
        return f"its columns are {list(row)[:10]}, not {list(LOG_FIELDS)}"
    if not row["model"]:
        return "no model tag"
    if not re.fullmatch(r"[1-9][0-9]{0,8}", row["epoch"]):
        return f"epoch {row['epoch'][:40]!r} is not a whole number of at least 1"
    for k in LOG_FIELDS[2:]:
        try:
            if not math.isfinite(float(row[k])):
                raise ValueError
        except ValueError:
            return f"{k} {row[k][:40]!r} is not a finite number"
    return ""


def drop_log_rows(path: Path, tag: str, after: int) -> None:
    """Forget ``tag``'s log rows past epoch ``after``: a kill between appending a row and writing the checkpoint
    leaves a row for an epoch that the resumed run trains (and logs) again."""
    rows = read_log(path)
    keep = [r for r in rows if not (r["model"] == tag and int(r["epoch"]) > after)]
    if not keep and rows:
        remove_run_files(path.parent, [], [path.name])  # append_csv writes the header again
    elif len(keep) < len(rows):
        atomic_write(path, write_csv, keep)


def made(folder: Path) -> None:
    """A run's folder made (a full disk: one line naming it)."""
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:
        if e.errno in DISK_FULL:
            raise disk_error(folder, e) from None
        raise
