"""The one exception type users see: it names the file or field, what was found, and the fix."""


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
