"""The one root of every error mesolite raises: catch `MesoliteError` to catch them all.

Each area has its own subclasses: `master.errors.MasterError`,
`agent.AgentError`, the SDK's `NotConnected`, `RpcError` and `InvalidCall`,
`mesolite.resources.InvalidResources`. Errors that also mean "a bad value"
derive from `ValueError` too, so code written against the standard library's
conventions still works.
"""

from __future__ import annotations


class MesoliteError(Exception):
    """Root of every error mesolite raises."""
