"""Roles: the roles file's settings applied to the allocator, and fair shares."""

from __future__ import annotations

from mesolite.master.allocator import RoleSettings
from mesolite.master.core import MasterCore, checked, log
from mesolite.master.fair_levels import InstantShares, fair_levels
from mesolite.master.fair_share import ShareInput, compute_fair_shares
from mesolite.master.role_config import RolesConfigError, load_roles
from mesolite.resources import EMPTY, Resources


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
        the cluster total change. Instantaneous ones follow activity and demand,
        so they are computed when asked for (reading /state, a preemption check),
        not on every offer; they are the ones preemption measures roles against
        (`instantaneous_fair_shares`).
        """
        inputs = self._share_inputs()
        total = self.allocator.total
        if self._steady_shares is None or self._steady_shares.keys() != inputs.keys():
            self._steady_shares = compute_fair_shares(inputs, total)
        return self._steady_shares, self.instantaneous_fair_shares().fair

    def instantaneous_fair_shares(self) -> InstantShares:
        """Every role's instantaneous fair share, capped by demand (`master/fair_levels.py`),
        with what each role of a live framework holds and, where every framework of
        it declared one, its demand (what it holds plus what it waits for).

        What a role holds does not count its outstanding offers: a starved role is
        offered what it cannot use, and declines it; it is no less starved."""
        tree = self.allocator.roles
        offered: dict[str, Resources] = {}
        for o in self.offers.values():
            role = tree.framework_role(o.offer.framework_id)
            offered[role] = offered.get(role, EMPTY) + o.offer.resources
        roles = {tree.framework_role(f) for f, fw in self.frameworks.items() if not fw.removing}
        held = {path: tree.role_allocation(path) - offered.get(path, EMPTY) for path in roles}
        demands = {
            path: held[path] + extra for path, extra in self.role_demands().items() if path in held
        }
        fair = fair_levels(
            self._share_inputs(), self.allocator.total, tree.active_roles(), demands, held
        )
        return InstantShares(fair, held, demands)

    def _cluster_changed(self) -> None:
        self._apply_roles()
