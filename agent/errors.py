"""The agent's errors, under mesolite's one root."""

from __future__ import annotations

from mesolite.errors import MesoliteError


class AgentError(MesoliteError):
    """Root of the errors the agent raises."""


class AgentRegistrationError(AgentError):
    """The master refused the registration (INVALID_ARGUMENT); retrying would not help."""
