"""Every Bicep file parses (pycep-parser and checkov's own parser), and checkov passes offline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from infra_helpers import INFRA, bicep_files, parse, unwrap

from tests.support import docs


def test_the_infra_tree_has_the_expected_entry_points() -> None:
    names = {p.relative_to(INFRA).as_posix() for p in bicep_files()}
    assert {"main.bicep", "forwarder.bicep"} <= names
    assert sum(name.startswith("modules/") for name in names) >= 8
    for extra in ("main.bicepparam", "abbreviations.json", "bicepconfig.json"):
        assert (INFRA / extra).is_file(), extra


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_bicep_file_parses(path: Path) -> None:
    tree = parse(path)
    # Resources or modules; or, for a check (drain-probe-guard.bicep), an output.
    assert tree.get("resources") or tree.get("modules") or tree.get("outputs"), (
        f"{path.name} declares nothing"
    )


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_parameter_has_a_description(path: Path) -> None:
    for name, param in parse(path).get("parameters", {}).items():
        kinds = {d["type"] for d in param["decorators"]}
        assert "description" in kinds, f"{path.name}: param {name} has no @description"


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_referenced_modules_and_files_exist(path: Path) -> None:
    text = path.read_text()
    tree = parse(path)
    for name, mod in tree.get("modules", {}).items():
        target = path.parent / mod["detail"]["path"]
        assert target.is_file(), f"{path.name}: module {name} -> {target} missing"
    for ref in re.findall(r"load(?:JsonContent|FileAsBase64|TextContent)\('([^']+)'", text):
        assert (path.parent / ref).is_file(), f"{path.name}: {ref} missing"


# A deployment name has at most 64 characters; a name built from a VM, group or subscription
# name (up to 64, 90 and 50 characters) is cut to 50 and made unique with uniqueString (13).
BOUNDED_NAME = re.compile(r"\$\{take\('[^']*', (\d+)\)\}-\$\{uniqueString\([^)]*\)\}")


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_module_deployment_names_fit_in_64_characters(path: Path) -> None:
    for symbol, mod in parse(path).get("modules", {}).items():
        name = unwrap(mod)["name"]
        assert isinstance(name, str), f"{path.name}: module {symbol} name {name!r}"
        if "${" not in name:
            assert len(name) <= 64, f"{path.name}: module {symbol}"
            continue
        bounded = BOUNDED_NAME.fullmatch(name)
        assert bounded, f"{path.name}: module {symbol} name may exceed 64 characters: {name}"
        assert int(bounded.group(1)) + 1 + 13 <= 64, f"{path.name}: module {symbol}"


def test_names_come_from_the_abbreviations_file() -> None:
    import json

    abbrs = json.loads((INFRA / "abbreviations.json").read_text())
    main_text = (INFRA / "main.bicep").read_text()
    assert "loadJsonContent('abbreviations.json')" in main_text
    used = set(re.findall(r"abbrs\.(\w+)", main_text))
    assert used, "main.bicep names nothing from abbreviations.json"
    assert used <= set(abbrs), f"unknown abbreviations: {used - set(abbrs)}"


def test_bicepparam_sets_only_parameters_of_main() -> None:
    text = (INFRA / "main.bicepparam").read_text()
    assert re.search(r"^using './main.bicep'$", text, re.M)
    main_params = parse(INFRA / "main.bicep")["parameters"]
    set_here = re.findall(r"^param (\w+) =", text, re.M)
    assert set_here
    assert set(set_here) <= set(main_params), set(set_here) - set(main_params)
    required = {n for n, p in main_params.items() if "default" not in p or p["default"] is None}
    assert required <= set(set_here), f"main.bicepparam misses required {required - set(set_here)}"


def _bicepparam_values() -> dict[str, str]:
    text = (INFRA / "main.bicepparam").read_text()
    return dict(re.findall(r"^param (\w+) = (.+?)\s*$", text, re.M))


def _deploy_steps_before_the_first_deployment() -> str:
    guide = deploy_guide()
    steps = guide.split("## Deploy the bridge", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return steps.split("az deployment group", 1)[0]


def test_the_example_cannot_be_deployed_without_a_secrets_officer() -> None:
    # Left empty, nobody may set the Key Vault secrets and `az keyvault secret set` fails: the
    # example reads it from the environment, with no default, so compiling it fails unset.
    value = _bicepparam_values()["secretsOfficerPrincipalId"]
    read = re.fullmatch(r"readEnvironmentVariable\('(\w+)'\)", value)
    assert read, f"secretsOfficerPrincipalId = {value}: not read from the environment"
    variable = read.group(1)
    # The steps set it before the first deployment, from the signed-in user.
    steps = _deploy_steps_before_the_first_deployment()
    assert f'export {variable}="$(az ad signed-in-user show --query id -o tsv)"' in steps


def test_the_deploy_steps_check_each_example_managed_group_exists() -> None:
    value = _bicepparam_values().get("lbManagedResourceGroups", "")
    text = (INFRA / "main.bicepparam").read_text()
    block = text.split("param lbManagedResourceGroups = [", 1)[1].split("]", 1)[0]
    groups = re.findall(r"^\s*'([^']+)'", block, re.M)
    assert value == "[" and groups, "main.bicepparam names no managed resource group"
    steps = _deploy_steps_before_the_first_deployment()
    for group in groups:
        assert f"az group show --name {group} " in steps, group
        assert f"az group create -n {group} " in steps, group


def test_pool_roles_are_deployed_per_managed_resource_group() -> None:
    mod = parse(INFRA / "main.bicep")["modules"]["poolRoles"]
    loop = mod["config"]["loop_type"]["detail"]
    assert loop["array_name"] == "lbManagedResourceGroups"
    scope = unwrap(mod)["scope"]["function"]
    assert scope["type"] == "resource_group"
    assert scope["parameters"]["resource_group_name"] == loop["item_name"]


# --- checkov -------------------------------------------------------------------------------


# checkov's Bicep parser (pycep-parser 0.5) predates fail(): the one file that calls it holds no
# resource, and tests/infra/test_infra_drain_probe_repairs.py evaluates it instead.
UNPARSED_BY_CHECKOV = {"modules/drain-probe-guard.bicep"}


@pytest.mark.slow
def test_checkov_parsed_every_file(checkov_report: dict[str, Any]) -> None:
    errors = {
        Path(p).resolve().relative_to(INFRA).as_posix()
        for p in checkov_report["results"].get("parsing_errors", [])
    }
    assert errors <= UNPARSED_BY_CHECKOV
    assert checkov_report["summary"]["parsing_errors"] == len(errors)
    for name in UNPARSED_BY_CHECKOV:
        assert parse(INFRA / name).get("resources", {}) == {}, f"{name} must hold no resource"
    assert checkov_report["summary"]["resource_count"] >= 40


def test_checkov_has_no_failed_check(checkov_report: dict[str, Any]) -> None:
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for c in checkov_report["results"]["failed_checks"]
    ]
    assert failed == []
    assert checkov_report["summary"]["passed"] > 0


def test_every_checkov_skip_is_justified_next_to_its_resource(
    checkov_report: dict[str, Any],
) -> None:
    skipped = checkov_report["results"]["skipped_checks"]
    for check in skipped:
        reason = (check["check_result"].get("suppress_comment") or "").strip()
        assert len(reason) >= 20, f"{check['check_id']} on {check['resource']}: no real reason"
        path = INFRA / check["file_path"].lstrip("/")
        start, end = check["file_line_range"]
        body = path.read_text().splitlines()[start - 1 : end]
        assert any(f"checkov:skip={check['check_id']}:" in line for line in body), check
    # Every skip comment in the tree is one checkov honoured (no stale or misplaced ones).
    honoured = {(c["file_path"].lstrip("/"), c["check_id"]) for c in skipped}
    written = {
        (p.relative_to(INFRA).as_posix(), m)
        for p in bicep_files()
        for m in re.findall(r"checkov:skip=(CKV\w+):", p.read_text())
    }
    assert written == honoured


def deploy_guide() -> str:
    """docs/deploy.md: the one deployment guide."""
    return docs.page("deploy")


@pytest.mark.parametrize("template", ["main.bicep", "forwarder.bicep"])
def test_deploy_guide_documents_every_parameter(template: str) -> None:
    guide = deploy_guide()
    table = guide.split(f"| Parameter (`{template}`)", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    assert documented == set(parse(INFRA / template)["parameters"])


def test_deploy_guide_documents_every_output() -> None:
    guide = deploy_guide()
    for name in parse(INFRA / "main.bicep")["outputs"]:
        assert f"`{name}`" in guide, name
