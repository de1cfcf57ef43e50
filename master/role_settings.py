"""Roles: the roles file's settings applied to the allocator, and fair shares."""

from __future__ import annotations

from mesolite.master.allocator import RoleSettings
from mesolite.master.core import MasterCore, checked, log
from mesolite.master.fair_share import ShareInput, compute_fair_shares
from mesolite.master.role_config import RolesConfigError, load_roles
from mesolite.resources import Resources


class RoleHandling(MasterCore):
    def _apply_roles(self) -> None:
        """Give the allocator the roles' absolute settings for the current cluster total.

        Percentages depend on the total, so this runs again whenever it changes.
        `--weights` (Mesos' flag) sets the weight of roles the file does not name.
        """
        settings = {
            role: RoleSettings(weight=weight) for role, weight in self.config.weights.items()
        }
        for path, (guarantee, limit) in self.roles_config.resolve(self.allocator.total).items():
            spec = self.roles_config.spec(path)
            settings[path] = RoleSettings(
                spec.weight, guarantee, limit, dict(spec.resource_weights) or None
            )
        self.allocator.configure_roles(settings)
        self._steady_shares = None

    @checked
    def reload_roles(self) -> bool:
        """Read the roles file again (on SIGHUP); an invalid file changes nothing."""
        if self.config.roles_file is None:
            log.info("no roles file to reload")
            return False
        try:
            config = load_roles(self.config.roles_file)
        except (RolesConfigError, OSError) as e:
            log.error("roles file rejected; the previous configuration stays", reason=str(e))
            return False
        self.roles_config = config
        self._apply_roles()
        log.info("roles reloaded", file=str(self.config.roles_file), roles=len(config.roles))
        self.request_allocation()
        return True

    def _share_inputs(self) -> dict[str, ShareInput]:
        tree = self.allocator.roles
        return {
            path: ShareInput(
                tree.role_weight(path),
                tree.role_guarantee(path),
                tree.role_limit(path),
                tree.role_resource_weights(path),
            )
            for path in tree.role_paths()
        }

    def fair_shares(self) -> tuple[dict[str, Resources], dict[str, Resources]]:
        """(steady, instantaneous) fair shares of every role.

        Steady shares are cached until the configuration, the roles in use or
        the cluster total change; instantaneous ones follow activity, so they
        are computed when asked for (reading /state), not on every offer.
        """
        inputs = self._share_inputs()
        total = self.allocator.total
        if self._steady_shares is None or self._steady_shares.keys() != inputs.keys():
            self._steady_shares = compute_fair_shares(inputs, total)
        active = self.allocator.roles.active_roles()
        return self._steady_shares, compute_fair_shares(inputs, total, active)

    def _cluster_changed(self) -> None:
        self._apply_roles()
