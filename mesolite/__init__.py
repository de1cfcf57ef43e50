"""mesolite: a Mesos-style cluster manager with Dominant Resource Fairness.

Shared pieces live here: the resource and task model every component uses, the
wire conversions, logging and gRPC set-up, and the `mesolite` command line.
"""

__version__ = "0.1.0"
