"""Error types. Each message is one line that names the problem and the fix.

`ConfigError` and `UsageError` are usage errors: the CLI prints them and exits with code 2.
"""

from __future__ import annotations


class RlaifError(Exception):
    """Base class for every error mlx-rlaif raises on purpose."""


class ConfigError(RlaifError, ValueError):
    """A config file, key, value or override is wrong. Raised before any model loads."""


class UsageError(RlaifError, ValueError):
    """A command-line argument or input file is wrong."""


class DataError(UsageError):
    """A task file is malformed; the message names file:line."""


class TeacherError(RlaifError):
    """A teacher API call failed in a way that must stop the run (401/403, budget)."""


class CheckpointError(RlaifError):
    """A checkpoint is missing, incomplete or does not match the model."""


class DiskFullError(RlaifError):
    """The disk under the run filled up (ENOSPC); the newest complete checkpoint is intact."""


class DistributedError(RlaifError):
    """Data-parallel ranks lost each other (a rank stopped, the network failed) or disagree."""


class RewardError(RlaifError):
    """A reward component (a user's function, a reward server) failed in a way that stops the
    step before its update: the message names the component, the task and what happened."""
