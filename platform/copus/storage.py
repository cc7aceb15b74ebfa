"""Where COPUS keeps a run's files, and how it reads and writes them: one filesystem layer
(pyarrow's, the one Ray Train's storage uses) for a local or shared path and for object
stores alike.

`output_dir` (and `profile.dir`, `copus compare`'s suite directory) may be a path or a URI
pyarrow accepts: `s3://bucket/prefix`, `gs://bucket/prefix`, with pyarrow's query options
(`s3://bucket/run?endpoint_override=host:9000&scheme=http` for an S3-compatible server).
Credentials come from the usual places (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the
instance's role, gcloud's application default credentials).

Used by every layer that writes run files (the driver, the controller, comparisons,
calibration, profile tables, export, fault markers), so it imports neither torch nor ray.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Iterator

import pyarrow.fs as pafs

RAY_STORAGE = "ray"  # Ray Train's storage_path under the output directory (checkpoints, results)
RAY_RUN_NAME = "train"


# The URI schemes pyarrow has filesystems for (besides plain paths).
SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")


# The longest name one path component may have (NAME_MAX of Linux and macOS filesystems).
NAME_MAX = 255
# Seconds a Google Cloud Storage call keeps retrying before it fails (pyarrow's default retries
# for many minutes: an unreachable store or missing credentials would look like a hang).
GCS_RETRY_LIMIT_S = 10
DEFAULT_ENDPOINTS = {"s3": "the AWS S3 endpoint", "gs": "storage.googleapis.com", "gcs": "storage.googleapis.com"}


class StorageError(ValueError):
    """An output location pyarrow cannot open (unknown scheme, bad query option), or a local
    path that cannot name a file (a symlink loop, a component too long)."""


class StoreUnreachable(StorageError, OSError):
    """An object store that did not answer (or refused) within its time limit. Also an OSError,
    so code that tolerates a failed read or write still does."""


def first_line(err: BaseException | str, limit: int = 300) -> str:
    """One line of an error message (pyarrow's and the AWS SDK's run over many lines)."""
    text = (str(err).strip().splitlines() or [""])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(text: str, limit: int = 120) -> str:
    """A user's value as it appears in a one-line message: control characters escaped, long
    values shortened."""
    text = text if text.isprintable() else ascii(text)[1:-1]
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 + 3 :]}"


def check_location(text: str) -> str:
    """A config value naming a location: a path, or a URI of a scheme pyarrow can open. Only
    the form is checked here (opening an s3:// location may ask the network for its region)."""
    scheme, sep, rest = text.partition("://")
    if not text.strip():
        raise StorageError("empty: name a directory (a path, or a URI)")
    if sep and scheme not in SCHEMES:
        raise StorageError(f"{shown(text)!r}: unknown scheme {scheme!r} (a path, or one of {', '.join(SCHEMES)})")
    if sep and not rest.partition("?")[0].strip("/"):
        raise StorageError(f"{shown(text)!r}: names no bucket or path")
    if not sep or scheme == "file":
        local_path(text[len("file://") :] if sep else text)
    return text


def local_path(text: str | os.PathLike) -> Path:
    """`text` as an absolute local path, or StorageError saying why it cannot name a file: a
    component longer than NAME_MAX bytes, a symlink loop, a dangling symbolic link (which a
    write would follow, creating its target somewhere the user never named)."""
    if not str(text).strip() or "\x00" in str(text):
        raise StorageError(f"{shown(str(text))!r}: empty or holds a NUL character: name a file or directory")
    raw = Path(text).expanduser()
    if any(len(os.fsencode(part)) > NAME_MAX for part in raw.parts):
        raise StorageError(f"{shown(str(text))}: a path component is longer than {NAME_MAX} bytes")
    try:
        resolved = raw.resolve()
    except (RuntimeError, OSError) as err:  # Python 3.11 says RuntimeError for a symlink loop
        raise StorageError(f"{shown(str(text))}: {_path_problem(err)}") from None
    for prefix in [raw, *raw.parents]:
        if prefix.is_symlink() and not prefix.exists():
            raise StorageError(
                f"{shown(str(text))}: {prefix} is a symbolic link to {os.readlink(prefix)}, which does not exist"
            )
    return resolved


def _path_problem(err: BaseException) -> str:
    if isinstance(err, RuntimeError) or getattr(err, "errno", None) == errno.ELOOP:
        return "a symbolic link loop"
    return getattr(err, "strerror", None) or first_line(err)


def _store_call(method):
    """An object store's failure (no answer, refused, no credentials) as StoreUnreachable naming
    the location and the endpoint; a missing file stays FileNotFoundError, local errors as they are."""

    @functools.wraps(method)
    def call(self: Location, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (FileNotFoundError, StorageError):
            raise
        except OSError as err:
            if self.is_local:
                raise
            raise StoreUnreachable(f"{self}: the store at {self.endpoint} failed: {first_line(err)}") from None

    return call


class Location:
    """A file or directory on a pyarrow filesystem, with the small part of pathlib's interface
    COPUS needs (`/`, `name`, `parent`, `exists`, `read_text`, `write_text`, `mkdir`, ...).
    `str()` gives back what a user would pass again (a path, or the URI with its query), so it
    can be stored in summaries and MLflow tags and parsed again by `Location.parse`."""

    def __init__(self, fs: pafs.FileSystem, path: str, scheme: str = "", query: str = ""):
        self.fs, self.path, self.scheme, self.query = fs, path.rstrip("/") or "/", scheme, query

    @classmethod
    def parse(cls, where: str | os.PathLike | Location) -> Location:
        if isinstance(where, Location):
            return where
        text = os.fspath(where)
        scheme, sep, _ = text.partition("://")
        if not sep or scheme == "file":
            return cls(pafs.LocalFileSystem(), str(local_path(text[len("file://") :] if sep else text)))
        check_location(text)
        try:
            fs, path = pafs.FileSystem.from_uri(bounded_uri(text, scheme))
        except Exception as err:  # pyarrow raises ArrowInvalid / ValueError / OSError
            raise StorageError(f"{shown(text)}: not a location pyarrow can open ({first_line(err)})") from None
        return cls(fs, path, scheme, text.partition("?")[2])

    # --- naming ---------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return self.fs.type_name == "local"

    @property
    def endpoint(self) -> str:
        """The server an object-store location talks to, for messages."""
        options = dict(part.partition("=")[::2] for part in self.query.split("&") if part)
        return options.get("endpoint_override") or DEFAULT_ENDPOINTS.get(self.scheme, f"{self.scheme}://")

    def __truediv__(self, name: str) -> Location:
        return Location(self.fs, f"{self.path.rstrip('/')}/{name}", self.scheme, self.query)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        return Location(self.fs, self.path.rsplit("/", 1)[0] or "/", self.scheme, self.query)

    def __str__(self) -> str:
        if self.is_local:
            return self.path
        return f"{self.scheme}://{self.path}" + (f"?{self.query}" if self.query else "")

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"

    def __eq__(self, other) -> bool:
        if isinstance(other, (str, os.PathLike)) and self.is_local:  # a local location equals its path
            return self.path == str(Path(other).expanduser().resolve())
        return isinstance(other, Location) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __fspath__(self) -> str:
        """Only a local location is a path the os can open."""
        return self.local_path().__fspath__()

    def local_path(self) -> Path:
        if not self.is_local:
            raise StorageError(f"{self}: an object-store location, not a local path")
        return Path(self.path)

    # --- queries --------------------------------------------------------------------------
    @_store_call
    def _info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self._info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self._info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self._info().type == pafs.FileType.Directory

    def size(self) -> int:
        return self._info().size

    @_store_call
    def iterdir(self) -> list[Location]:
        """The entries directly under this directory (none when it does not exist), by name."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return sorted((Location(self.fs, i.path, self.scheme, self.query) for i in infos), key=lambda c: c.name)

    # --- reading --------------------------------------------------------------------------
    @_store_call
    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.path) as fh:
                return fh.read()
        except OSError as err:  # an object store says "not found" in its own words
            if isinstance(err, FileNotFoundError) or not self.exists():
                raise FileNotFoundError(f"{self}: no such file") from None
            raise

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def read_json(self):
        return json.loads(self.read_text())

    @_store_call
    def open_input(self) -> IO[bytes]:
        return self.fs.open_input_stream(self.path)

    # --- writing --------------------------------------------------------------------------
    @_store_call
    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        self.fs.create_dir(self.path, recursive=True)

    @_store_call
    def write_bytes(self, data: bytes) -> None:
        """Whole or not at all: a reader sees the previous file or the new one, never half of
        one. Locally a temporary file renamed over the target; on an object store one PUT,
        which stores are atomic for."""
        if not self.is_local:
            with self.fs.open_output_stream(self.path) as fh:
                fh.write(data)
            return
        self.parent.mkdir()
        tmp = self.parent / f".{self.name}.tmp"
        with self.fs.open_output_stream(tmp.path) as fh:
            fh.write(data)
        self.fs.move(tmp.path, self.path)  # rename(2): atomic on one filesystem

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def write_json(self, data, indent: int | None = 2) -> None:
        self.write_text(json.dumps(data, indent=indent))

    @_store_call
    def unlink(self, missing_ok: bool = True) -> None:
        try:
            self.fs.delete_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    @_store_call
    def rmtree(self) -> None:
        """Remove this directory and everything under it; nothing there is fine."""
        if self.is_dir():
            self.fs.delete_dir(self.path)

    # --- moving whole trees between here and a local directory ----------------------------
    @_store_call
    def download_to(self, local: Path) -> Path:
        local.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(self.path, str(local), source_filesystem=self.fs, destination_filesystem=pafs.LocalFileSystem())
        return local

    @_store_call
    def upload_from(self, local: Path) -> None:
        self.mkdir()
        pafs.copy_files(str(local), self.path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)


def bounded_uri(uri: str, scheme: str) -> str:
    """The URI pyarrow opens: a Google Cloud Storage one with a retry limit unless it sets its own."""
    if scheme not in ("gs", "gcs") or "retry_limit_seconds=" in uri:
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}retry_limit_seconds={GCS_RETRY_LIMIT_S}"


def write_json_atomic(path: Location | Path, data) -> None:
    """Write JSON so that a crash leaves the previous file or the new one, never half of one."""
    Location.parse(path).write_json(data)


def ray_storage(output_dir: Location) -> Location:
    return output_dir / RAY_STORAGE


def ray_storage_args(storage: Location) -> dict:
    """A Ray Train or Tune RunConfig's storage_path and storage_filesystem for `storage`: the
    same filesystem object COPUS uses (an S3 endpoint given in the URI's query reaches Ray too)."""
    if storage.is_local:
        return {"storage_path": storage.path}
    return {"storage_path": storage.path, "storage_filesystem": storage.fs}


@contextlib.contextmanager
def local_copy(where: Location) -> Iterator[Path]:
    """A directory's files as a local directory: the directory itself when it is local, else a
    temporary download removed on exit."""
    if where.is_local:
        yield where.local_path()
        return
    tmp = Path(tempfile.mkdtemp(prefix="copus-download-"))
    try:
        yield where.download_to(tmp / where.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class AppendLog:
    """A text file written line by line (records.jsonl). Local: appended and flushed per batch.
    An object store has no append, so the lines go to a local copy (seeded with what is already
    there, for a resumed run) that is uploaded whole at most every `upload_every_s` seconds and
    on close: a driver that dies loses at most that much of the log in storage."""

    def __init__(self, where: Location, upload_every_s: float = 30.0):
        self.where, self.upload_every_s = where, upload_every_s
        self._staging: Path | None = None
        if where.is_local:
            where.parent.mkdir()
            self._fh = open(where.path, "a")
        else:
            self._staging = Path(tempfile.mkdtemp(prefix="copus-log-")) / where.name
            self._staging.write_bytes(where.read_bytes() if where.is_file() else b"")
            self._fh = open(self._staging, "a")
        # A driver that died mid-write left its last line cut short: what is appended now starts
        # on a line of its own, so the cut line stays one bad line (counted by the reader) and
        # does not swallow the next record.
        if self._fh.tell() > 0 and not _ends_with_newline(where.path if where.is_local else self._staging):
            self._fh.write("\n")
        self._uploaded = time.monotonic()

    def write(self, text: str) -> None:
        self._fh.write(text)

    def flush(self, force: bool = False) -> None:
        self._fh.flush()
        if self._staging is not None and (force or time.monotonic() - self._uploaded >= self.upload_every_s):
            self.where.write_bytes(self._staging.read_bytes())
            self._uploaded = time.monotonic()

    def close(self) -> None:
        if self._fh.closed:
            return
        self.flush(force=True)
        self._fh.close()
        if self._staging is not None:
            shutil.rmtree(self._staging.parent, ignore_errors=True)


def _ends_with_newline(path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


@contextlib.contextmanager
def staged_directory(where: Location) -> Iterator[Path]:
    """A local directory whose files end up in `where`: the directory itself when it is local,
    else a temporary one uploaded on a clean exit (nothing is uploaded after an error)."""
    if where.is_local:
        where.mkdir()
        yield where.local_path()
        return
    tmp = Path(tempfile.mkdtemp(prefix="copus-upload-"))
    try:
        yield tmp
        where.upload_from(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_lines(where: Location) -> Iterator[str]:
    """The lines of a text file (records.jsonl) on any filesystem; none when it is absent."""
    if not where.is_file():
        return iter(())
    return iter(where.read_text().splitlines(keepends=True))
