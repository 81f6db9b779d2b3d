"""The one exception type users see: it names the file or field, what was found, and the fix."""

import errno
import os


class VideoGRPOError(Exception):
    """A user-facing failure; the CLI prints its message without a traceback and exits with `exit_code`."""

    exit_code = 2


class ConfigError(VideoGRPOError):
    """The resolved configuration breaks a rule (exit code 3)."""

    exit_code = 3


class DigestMismatch(VideoGRPOError):
    """An artifact's digest differs from the one pinned (exit code 4)."""

    exit_code = 4


class DataError(VideoGRPOError):
    """Input data is malformed or incomplete (exit code 5)."""

    exit_code = 5


class DiskFull(VideoGRPOError):
    """A file system filled up (or a quota ran out) while a stage wrote: its message names the file and the fix.
    Never a sample's or a rank's own failure: the whole stage stops on it, whatever evalkit.fail_on_error says."""


def disk_full_message(err: BaseException, near: str | os.PathLike | None = None) -> str | None:
    """A full file system (or quota) as a message naming the file and the fix; None for other errors. The OSError
    may be wrapped (torch's checkpoint writer gathers each rank's as a CheckpointException). `near`: the directory
    the caller was writing under, named when the error names no file (a library's own write)."""
    if (found := disk_full_cause(err)) is None:
        return None
    where = f" writing {found.filename}" if found.filename else (f" writing under {near}" if near else "")
    return (
        f"no space left on device{where} ({found.strerror}); free space on that file system, or point "
        f"`results` at a larger one (--config results=<dir>), then rerun: finished stages are kept and training "
        f"resumes from its last checkpoint (train.keep_checkpoints sets how many it keeps)"
    )


def disk_full_cause(err: BaseException | None, depth: int = 0) -> OSError | None:
    """The ENOSPC or EDQUOT OSError behind `err`: itself, its cause or context, or one of the per-rank failures a
    torch CheckpointException holds."""
    if err is None or depth > 8:
        return None
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return err
    for wrapped in getattr(err, "failures", {}).values() if isinstance(getattr(err, "failures", None), dict) else ():
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, BaseException) and (found := disk_full_cause(inner, depth + 1)) is not None:
            return found
    return disk_full_cause(err.__cause__ or err.__context__, depth + 1)
