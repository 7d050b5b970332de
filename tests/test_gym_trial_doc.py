"""docs/operations.md's GPU-free Gym trial, checked without Gym (tests/test_gym_stack.py runs it).

`benchmarks/gym_stack.py` reads the page's `<!-- gym-trial:NAME -->` blocks and runs them; here:
every block is there, the configs it names are shipped in `genrm-trio gym-root`, the shipped
overlay replaces every model server the shipped config uses (with Gym's `_delete_key` rule), the
venv links cover every server the merged config starts, and the `genrm-trio` commands parse.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from loading import load_script

from genrm_trio.app.cli import build_parser
from genrm_trio.app.gym import gym_root

ROOT = Path(__file__).resolve().parents[1]
DOC_TEXT = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
CONFIGS = gym_root() / "resources_servers" / "genrm_trio" / "configs"


def gym_stack() -> ModuleType:
    return load_script("benchmarks/gym_stack.py", "gym_stack")


STEPS: dict[str, str] = gym_stack().trial_steps()


def merged(*paths: Path) -> dict[str, Any]:
    """Gym's merge of `--config` files: later files win key by key; a mapping's `_delete_key`
    names sibling keys to drop after the merge (nemo_gym/global_config.py)."""

    def merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
        for key, value in more.items():
            if isinstance(value, Mapping) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = dict(value) if isinstance(value, Mapping) else value

    def delete(node: dict[str, Any]) -> None:
        names = node.pop("_delete_key", None)
        for name in str(names).split(",") if names else ():
            node.pop(name.strip(), None)
        for value in node.values():
            if isinstance(value, dict):
                delete(value)

    result: dict[str, Any] = {}
    for path in paths:
        merge(result, yaml.safe_load(path.read_text()))
    delete(result)
    return result


def configs_of_the_gym_step() -> list[Path]:
    named = re.findall(r"--config (resources_servers/genrm_trio/configs/\S+\.yaml)", STEPS["gym"])
    return [gym_root() / name for name in named]


def test_every_step_is_on_the_page() -> None:
    assert list(STEPS) == list(gym_stack().STEPS)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in STEPS["env"]
    assert "+skip_venv_if_present=true" in STEPS["gym"]
    assert '+uv_venv_dir="$PWD/venvs"' in STEPS["gym"]


def test_the_gym_step_names_the_shipped_configs() -> None:
    assert configs_of_the_gym_step() == [CONFIGS / "genrm_trio.yaml", CONFIGS / "sim_models.yaml"]
    assert all(path.is_file() for path in configs_of_the_gym_step())


def test_the_overlay_replaces_every_model_server_with_the_simulated_one() -> None:
    config = merged(*configs_of_the_gym_step())
    referenced = set()
    for instance in config.values():
        for servers in instance.values() if isinstance(instance, dict) else ():
            for server in servers.values() if isinstance(servers, dict) else ():
                for key in ("model_server", "genrm_model_server"):
                    if isinstance(server, dict) and key in server:
                        referenced.add(server[key]["name"])
    assert referenced == {"genrm_model", "policy_model", "policy_model_reasoning_off"}
    for name in referenced:
        # the local-vLLM genrm_model block is gone: one openai_model, at the simulated server
        [(kind, server)] = config[name]["responses_api_models"].items()
        assert kind == "openai_model"
        assert server["entrypoint"] == "app.py"
        assert server["openai_base_url"] == "${oc.env:GENRM_TRIO_SIM_URL,http://127.0.0.1:8000/v1}"
    assert "GENRM_TRIO_SIM_URL=http://127.0.0.1:$SIM_PORT/v1" in STEPS["env"]


def test_the_links_cover_every_server_gym_starts() -> None:
    config = merged(*configs_of_the_gym_step())
    started = {
        f"{kind}/{name}"
        for instance in config.values()
        if isinstance(instance, dict)
        for kind, servers in instance.items()
        if isinstance(servers, dict)
        for name, server in servers.items()
        if isinstance(server, dict) and "entrypoint" in server
    }
    words = shlex.split(STEPS["links"].replace("\\\n", " "), comments=True)
    listed = set(words[words.index("in") + 1 : words.index("do")]) if "in" in words else set()
    listed = {word.rstrip(";") for word in listed}
    assert "venvs/resources_servers/genrm_trio/.venv" in STEPS["links"]
    assert started == listed | {"resources_servers/genrm_trio"}


def test_the_genrm_trio_commands_parse() -> None:
    for step in ("judge", "judge-partial", "judge-failing"):
        text = STEPS[step].replace('"$TRIO_VENV/bin/genrm-trio"', "genrm-trio")
        argv = shlex.split(text.replace('"$SIM_PORT"', "8000"))
        assert argv[0] == "genrm-trio"
        args = build_parser().parse_args(argv[1:])
        assert args.command == "sim-judge" and args.policy is True


def test_step_7_fails_the_comparisons_of_one_answer_of_the_policy() -> None:
    """The partial fault matches one of the 16 answers the policy stand-in gives a prompt (it
    numbers them `(variant 0)` to `(variant 15)`), and no other: a rollout and its two
    comparisons, in each group."""
    from genrm_trio.testing.flags import parse_fault_rule
    from genrm_trio.testing.policy import PolicyStandIn

    text = STEPS["judge-partial"].replace('"$TRIO_VENV/bin/genrm-trio"', "genrm-trio")
    argv = shlex.split(text.replace('"$SIM_PORT"', "8000"))
    args = build_parser().parse_args(argv[1:])
    [rule] = [parse_fault_rule(spec) for spec in args.fault]
    assert (rule.fault, rule.position) == ("http_500", "either")
    policy = PolicyStandIn()
    answers = [policy.answer("a prompt") for _ in range(16)]
    hit = [i for i, answer in enumerate(answers) if rule.match in answer]
    assert hit == [3]
    # the circle's comparisons with rollout 3: (2, 3) and (3, 4); their rollouts are masked
    pairs = [(i, (i + 1) % 16) for i in range(16)]
    failed = [pair for pair in pairs if rule.selects(answers[pair[0]], answers[pair[1]])]
    assert failed == [(2, 3), (3, 4)]
    assert "the 26 scored" in " ".join(DOC_TEXT.split()) and "the 6 masked" in DOC_TEXT
