"""The mesolite master: tracks agents and frameworks and offers resources by DRF."""
