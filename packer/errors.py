"""Named errors and the process exit codes the CLI maps them to.

Exit codes (documented in README.md):
    0  success
    1  the build or command failed (I/O, bad tokenizer, internal error)
    2  usage or configuration error (bad flag, unknown pipeline key, bad value; ``ArgumentError`` from a library
       check of a value the user gave)
    3  a bad record under ``--strict``
    5  the build failed its quality bar (``--max-bad-fraction``); the manifest says "failed"
    6  ``packer verify`` found a problem
"""


class PackerError(Exception):
    """Base class: every error packer raises on purpose."""

    exit_code = 1


class ConfigError(PackerError):
    """A pipeline key or command-line value is unknown or out of range."""

    exit_code = 2


class ArgumentError(ConfigError, ValueError):
    """A library function's argument out of range, where the value comes from the user (a flag, a file it names):
    a ValueError to a caller of the library, a configuration error (one line, exit 2) to the command line. Raised
    by the check of the argument itself, so an unexpected ValueError deeper down still shows as the bug it is."""


class NotABuildError(ConfigError):
    """A folder named as a build holds no finished build's manifest: the command was pointed at the wrong folder
    (exit 2); ``packer verify`` reports it as the build's problem instead (exit 6)."""


class StrictModeError(PackerError):
    """``--strict`` met a record that would have been quarantined."""

    exit_code = 3


class BuildFailedError(PackerError):
    """Too many bad records: the build stopped and marked its manifest failed."""

    exit_code = 5


class VerifyError(PackerError):
    """``packer verify`` found a damaged or inconsistent build."""

    exit_code = 6


class DamagedShardError(PackerError):
    """A shard's bytes do not hold what a packer shard can: offsets outside their buffers, values no
    build writes (a damaged disk block, a bad copy). Raised before any row is used; ``reason`` says
    what is wrong (and where) in one line, without the file's name."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class SchemaVersionError(PackerError):
    """A shard or manifest written with a schema version this packer does not read."""


class BadRecord(Exception):
    """One input record cannot be used. Caught per record and quarantined.

    ``reason`` is a short stable code (``malformed_json``, ``unknown_role``, ...) that
    reports group by; ``detail`` says what exactly was wrong, for a human.
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
