"""The roles file: what it accepts, what it refuses (with the line), and resolve()."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesolite.master.role_config import (
    Amount,
    RolesConfig,
    RolesConfigError,
    RoleSpec,
    ancestor_roles,
    is_valid_role,
    load_roles,
    parent_role,
    parse_roles,
)
from mesolite.resources import Resources

EXAMPLE = """\
# The example from the roles documentation.
[roles.eng]
weight = 2.0
guarantee = { cpus = 8, mem = "25%" }   # absolute, or a percentage of the cluster
limit = { cpus = "50%" }

[roles."eng/ml"]
weight = 1.0
limit = { gpus = 2 }

[roles.ops]
guarantee = { cpus = 2 }
"""


def test_the_documented_example() -> None:
    config = parse_roles(EXAMPLE)
    assert list(config.roles) == ["*", "eng", "eng/ml", "ops"]
    assert config.roles["eng"] == RoleSpec(
        "eng",
        2.0,
        {"cpus": Amount(8.0), "mem": Amount(25.0, percent=True)},
        {"cpus": Amount(50.0, percent=True)},
    )
    assert config.roles["eng/ml"] == RoleSpec("eng/ml", 1.0, {}, {"gpus": Amount(2.0)})
    assert config.roles["ops"] == RoleSpec("ops", 1.0, {"cpus": Amount(2.0)}, {})
    assert config.roles["*"] == RoleSpec("*")


def test_resolve_against_the_cluster_total() -> None:
    config = parse_roles(EXAMPLE)
    resolved = config.resolve(Resources(cpus=40, mem=1000, gpus=4))
    assert resolved == {
        "*": (Resources(), None),
        "eng": (Resources(cpus=8, mem=250), {"cpus": 20.0}),
        "eng/ml": (Resources(), {"gpus": 2.0}),
        "ops": (Resources(cpus=2), None),
    }


def test_resolve_cuts_a_guarantee_to_a_limit_of_the_other_kind() -> None:
    # 8 cpus guaranteed under a limit of 50%: fine on 40 cpus, cut on 10.
    resolved = parse_roles(EXAMPLE).resolve(Resources(cpus=10, mem=1000))
    assert resolved["eng"] == (Resources(cpus=5, mem=250), {"cpus": 5.0})


def test_percentages_are_exact_decimals_rounded_down() -> None:
    config = parse_roles(
        '[roles.a]\nguarantee = { cpus = "33.3%", mem = "12.5%" }\nlimit = { gpus = "50%" }'
    )
    guarantee, limit = config.resolve(Resources(cpus=10, mem=0.009, gpus=0.003))["a"]
    # 33.3% of 10 is 3.33 exactly, though 33.3 * 10 / 100 is 3.3299999... in floats.
    assert guarantee == Resources(cpus=3.33, mem=0.001)  # 12.5% of 9 thousandths: 1.125
    assert limit == {"gpus": 0.001}  # 50% of 3 thousandths: 1.5


def test_percentages_of_missing_resources_are_zero_and_zero_limits_stay() -> None:
    config = parse_roles('[roles.a]\nguarantee = { gpus = "10%" }\nlimit = { gpus = 0 }')
    assert config.resolve(Resources(cpus=4))["a"] == (Resources(), {"gpus": 0.0})
    config = parse_roles('[roles.a]\nlimit = { gpus = "10%" }')
    assert config.resolve(Resources(cpus=4))["a"] == (Resources(), {"gpus": 0.0})


def test_implicit_parents_have_weight_one() -> None:
    config = parse_roles('[roles."a/b/c"]\nweight = 3')
    assert list(config.roles) == ["*", "a", "a/b", "a/b/c"]
    assert config.roles["a"] == RoleSpec("a") == config.spec("a")
    assert config.roles["a/b"].weight == 1.0
    assert config.roles["a/b/c"].weight == 3.0


def test_the_default_role_may_be_configured() -> None:
    config = parse_roles(
        '[roles."*"]\nweight = 0.5\nguarantee = { cpus = 1 }\nlimit = { mem = 64 }'
    )
    assert config.roles["*"] == RoleSpec("*", 0.5, {"cpus": Amount(1.0)}, {"mem": Amount(64.0)})


@pytest.mark.parametrize(
    "text",
    [
        "roles.eng.weight = 2\nroles.eng.guarantee.cpus = 1\nroles.eng.limit.mem = '50%'\n",
        "[roles]\neng.weight = 2\neng.guarantee = { cpus = 1 }\neng.limit.mem = '50%'\n",
        "[roles.eng]\nweight = 2\n[roles.eng.guarantee]\ncpus = 1\n"
        "[roles.eng.limit]\nmem = '50%'\n",
        "[roles.'eng']\nweight = 2\nguarantee = {cpus=1}\nlimit = {mem=\"50%\"}\n",
    ],
    ids=["dotted keys", "roles table", "sub-tables", "literal-string key"],
)
def test_other_toml_layouts_mean_the_same(text: str) -> None:
    expected = RoleSpec("eng", 2.0, {"cpus": Amount(1.0)}, {"mem": Amount(50.0, percent=True)})
    assert parse_roles(text).roles["eng"] == expected


def test_weights_and_amounts() -> None:
    config = parse_roles(
        "[roles.a]\nweight = 0\nguarantee = { cpus = 1.5, disk = 0 }\n"
        "[roles.b]\nweight = 3\nlimit = { cpus = 1e15, mem = '0%', gpus = '100%' }\n"
    )
    assert config.roles["a"].weight == 0.0
    assert config.roles["a"].guarantee == {"cpus": Amount(1.5), "disk": Amount(0.0)}
    assert config.roles["b"].weight == 3.0
    assert config.roles["b"].limit == {
        "cpus": Amount(1e15),
        "mem": Amount(0.0, percent=True),
        "gpus": Amount(100.0, percent=True),
    }


def test_a_weight_may_be_a_table_per_resource() -> None:
    config = parse_roles(
        "[roles.a]\nweight = { cpus = 2, mem = 0.5 }\n"
        "[roles.b]\nweight = 3\n"
        "[roles.c]\nweight = {}\n"
        "[roles.d.weight]\ngpus = 0\n"
    )
    # Resources the table does not name weigh 1.
    assert config.roles["a"].weight == 1.0
    assert config.roles["a"].resource_weights == {"cpus": 2.0, "mem": 0.5}
    assert config.roles["b"].weight == 3.0 and config.roles["b"].resource_weights == {}
    assert config.roles["c"].weight == 1.0 and config.roles["c"].resource_weights == {}
    assert config.roles["d"].resource_weights == {"gpus": 0.0}
    assert config.spec("nobody").resource_weights == {}


def test_empty_file_is_the_default_config() -> None:
    assert parse_roles("") == RolesConfig.default()
    assert parse_roles("# nothing yet\n[roles]\n") == RolesConfig.default()
    assert list(RolesConfig.default().roles) == ["*"]


def test_spec_of_an_undeclared_role_is_the_default() -> None:
    assert parse_roles(EXAMPLE).spec("web/frontend") == RoleSpec("web/frontend", 1.0, {}, {})


def test_configs_cannot_be_changed_after_parsing() -> None:
    config = parse_roles(EXAMPLE)
    with pytest.raises(TypeError):
        config.roles["x"] = RoleSpec("x")  # type: ignore[index]
    with pytest.raises(TypeError):
        config.roles["eng"].guarantee["cpus"] = Amount(1)  # type: ignore[index]


def test_paths() -> None:
    assert parent_role("a/b/c") == "a/b" == RolesConfig.parent("a/b/c")
    assert parent_role("a") is None
    assert ancestor_roles("a/b/c") == ("a/b", "a") == RolesConfig.ancestors("a/b/c")
    assert ancestor_roles("*") == ()
    for good in ["*", "eng", "eng/ml", "a.b/c-d/E_9"]:
        assert is_valid_role(good), good
    for bad in ["", "/a", "a/", "a//b", "a b", "a/./b", "..", "*/x", "a/*", "é"]:
        assert not is_valid_role(bad), bad


def test_load_roles_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "roles.toml"
    path.write_text(EXAMPLE)
    assert load_roles(path) == parse_roles(EXAMPLE)


def test_load_roles_names_the_file_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "roles.toml"
    path.write_text(EXAMPLE.replace("weight = 1.0", "weight = -1.0"))
    with pytest.raises(RolesConfigError) as caught:
        load_roles(path)
    assert str(caught.value).startswith(f"{path}:8: ")
    assert caught.value.line == 8
    with pytest.raises(RolesConfigError, match="cannot read"):
        load_roles(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(RolesConfigError, match=r"bad\.toml"):
        load_roles(tmp_path / "bad.toml")


def test_amount_str() -> None:
    assert str(Amount(8.0)) == "8"
    assert str(Amount(12.5, percent=True)) == "12.5%"


def test_amount_units() -> None:
    assert Amount(1.5).units(0) == 1500
    assert Amount(50.0, percent=True).units(3) == 1
    assert Amount(100.0, percent=True).units(10**18) == 10**18


# Invalid files: the message names the file and the line ------------------------

INVALID = [
    # (text, line, part of the message)
    ("[roles.eng]\nweight = 2\n[roles.ops\n", 3, "invalid TOML"),
    ("[roles.eng]\nweight = = 2\n", 2, "invalid TOML"),
    ("[roles.eng]\n\n[role.ops]\nweight = 1\n", 3, "unknown key 'role'"),
    ("roles = 3\n", 1, "'roles' must be a table"),
    ("roles.eng = 3\n", 1, "role 'eng' must be a table"),
    ('[roles."eng ml"]\n', 1, "invalid role name 'eng ml'"),
    ('[roles.eng]\n[roles."eng/./x"]\n', 2, "invalid role name"),
    ('[roles."eng/"]\n', 1, "invalid role name"),
    ('[roles."*/x"]\nweight = 1\n', 1, "cannot have children"),
    ("[roles.eng]\nweight = 1\nwieght = 2\n", 3, "unknown key 'wieght'"),
    ("[roles.eng]\n[roles.eng.ml]\nweight = 1\n", 2, '[roles."eng/ml"]'),
    ('[roles.eng]\nweight = "2"\n', 2, "weight must be a finite number >= 0"),
    ("[roles.eng]\nweight = -0.5\n", 2, "weight must be"),
    ("[roles.eng]\nweight = nan\n", 2, "weight must be"),
    ("[roles.eng]\nweight = inf\n", 2, "weight must be"),
    ("[roles.eng]\nweight = true\n", 2, "weight must be"),
    ("[roles.eng]\nweight = 1" + "0" * 400 + "\n", 2, "weight must be"),
    ("[roles.eng]\n\nguarantee = 8\n", 3, "guarantee must be a table"),
    ("[roles.eng]\nlimit = { 9lives = 1 }\n", 2, "invalid resource name '9lives'"),
    ("[roles.eng]\nguarantee = { cpus = -1 }\n", 2, "between 0 and 1e+15"),
    ("[roles.eng]\nguarantee = { cpus = 2e15 }\n", 2, "between 0 and 1e+15"),
    ("[roles.eng]\nguarantee = { cpus = nan }\n", 2, "between 0 and 1e+15"),
    ("[roles.eng]\nguarantee = { cpus = 1" + "0" * 400 + " }\n", 2, "between 0 and 1e+15"),
    ("[roles.eng]\nguarantee = { cpus = true }\n", 2, 'must be a number or "N%"'),
    ("[roles.eng]\nguarantee = { cpus = [1] }\n", 2, 'must be a number or "N%"'),
    ('[roles.eng]\nlimit = { cpus = "half" }\n', 2, 'is not "N%"'),
    ('[roles.eng]\nlimit = { cpus = "-5%" }\n', 2, 'is not "N%"'),
    ('[roles.eng]\nlimit = { cpus = "150%" }\n', 2, "above 100%"),
    ("[roles.eng]\nguarantee = { cpus = 3 }\nlimit = { cpus = 2 }\n", 2, "above its limit 2"),
    ("[roles.eng]\nlimit.cpus = '20%'\nguarantee.cpus = '30%'\n", 3, "above its limit 20%"),
    ("[roles.eng]\nlimit = { gpus = 0 }\nguarantee = { gpus = 1 }\n", 3, "above its limit 0"),
    (
        '[roles.eng]\nlimit = { cpus = 4 }\n\n[roles."eng/ml"]\nguarantee = { cpus = 5 }\n',
        5,
        "guarantee cpus = 5 is above the limit 4 of 'eng'",
    ),
    (
        '[roles.a]\nlimit = { cpus = "10%" }\n'
        '[roles."a/b/c"]\nweight = 2\nguarantee.cpus = "11%"\n',
        5,
        "above the limit 10% of 'a'",
    ),
    (
        "roles.x.weight = 1\nroles.y.weight = 2\nroles.y.guarantee.cpus = -1\n",
        3,
        "between 0 and 1e+15",
    ),
    ("[roles]\nx.weight = 1\n'y'.weight = -2\n", 3, "role 'y': weight"),
    ('[roles]\nx.weight = 1\n"y/z".limit = { cpus = "x" }\n', 3, "role 'y/z': limit cpus"),
    (
        '[roles.a]\nweight = 1\n\n[roles.b]   # comment\nweight = 1\nlimit = { cpus = "%" }\n',
        6,
        "role 'b': limit cpus",
    ),
    # Weight vectors: each weight checked as a scalar one, with its line.
    ("[roles.eng]\n\nweight = { cpus = -1 }\n", 3, "role 'eng': weight cpus must be a finite"),
    ("[roles.eng]\nweight = { cpus = 2, mem = nan }\n", 2, "weight mem must be a finite"),
    ("[roles.eng]\nweight = { cpus = inf }\n", 2, "weight cpus must be a finite number >= 0"),
    ('[roles.eng]\nweight = { cpus = "2" }\n', 2, "weight cpus must be a finite number"),
    ("[roles.eng]\nweight = { cpus = true }\n", 2, "weight cpus must be a finite number"),
    ("[roles.eng]\nweight = { cpus = { x = 1 } }\n", 2, "weight cpus must be a finite number"),
    ("[roles.eng]\nweight = { 9lives = 1 }\n", 2, "invalid resource name '9lives' in weight"),
    ("[roles.eng]\nweight = [1, 2]\n", 2, "or a table of them per resource"),
    ("[roles.eng]\n[roles.eng.weight]\ncpus = 1\nmem = -3\n", 4, "role 'eng': weight mem"),
    ("roles.a.weight.cpus = 1\nroles.a.weight.gpus = -1\n", 2, "role 'a': weight gpus"),
]


@pytest.mark.parametrize("text, line, problem", INVALID)
def test_invalid_files_are_refused_with_file_and_line(text: str, line: int, problem: str) -> None:
    with pytest.raises(RolesConfigError) as caught:
        parse_roles(text, source="conf/roles.toml")
    message = str(caught.value)
    assert message.startswith(f"conf/roles.toml:{line}: "), message
    assert problem in message
    assert caught.value.line == line
    assert caught.value.source == "conf/roles.toml"


def test_a_mixed_kind_guarantee_above_a_limit_is_judged_at_resolve() -> None:
    config = parse_roles("[roles.a]\nguarantee = { cpus = 8 }\nlimit = { cpus = '50%' }")
    assert config.resolve(Resources(cpus=100))["a"][0] == Resources(cpus=8)
    assert config.resolve(Resources(cpus=4))["a"][0] == Resources(cpus=2)


def test_public_names() -> None:
    import mesolite.master.role_config

    assert sorted(mesolite.master.role_config.__all__) == [
        "Amount",
        "DEFAULT_ROLE",
        "Resolved",
        "RoleSpec",
        "RolesConfig",
        "RolesConfigError",
        "ancestor_roles",
        "is_valid_role",
        "load_roles",
        "parent_role",
        "parse_roles",
    ]
