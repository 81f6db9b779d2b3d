"""The one exception type users see: it names the file or field, what was found, and the fix."""

import errno


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


def disk_full_message(err: OSError) -> str | None:
    """A full file system (or quota) as a message naming the file and the fix; None for other OS errors."""
    if err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = f" writing {err.filename}" if err.filename else ""
    return (
        f"no space left on device{where} ({err.strerror}); free space on that file system, lower "
        f"train.keep_checkpoints, or point `results` at a larger one, then rerun (training resumes)"
    )
