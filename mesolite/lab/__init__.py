"""The lab, on top of everything else: the demo, the DRF paper's experiment and the
exact fairness references (`drf_reference`) the tests and the demo compare against.

The lab may import the master, the agent and the SDK; nothing below imports the
lab (checked by the layering contract in pyproject.toml).
"""
