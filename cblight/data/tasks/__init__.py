"""Every benchmark of the paper as a ``TaskSpec``; importing this package registers them all."""

from cblight.data.tasks import copa, lambada  # noqa: F401
