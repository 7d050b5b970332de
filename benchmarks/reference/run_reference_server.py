"""Run NeMo Gym 0.7.0's reference `genrm_compare` resources server standalone on 127.0.0.1.

Run it with the reference venv's interpreter (Python 3.13, `nemo-gym==0.7.0` installed):

    /tmp/ref-venv/bin/python benchmarks/reference/run_reference_server.py \
        --port 8200 --judge-url 127.0.0.1:8300 [--num-rollouts 16] [--set key=value ...]

How it works. `gym env start` / `ng_run` launches every server as a child process whose whole,
already-resolved global config arrives in the environment variable `NEMO_GYM_CONFIG_DICT` (YAML)
and whose own top-level key arrives in `NEMO_GYM_CONFIG_PATH`; the child then calls
`<ServerClass>.run_webserver()` (see nemo_gym/cli/env.py `_start` and server_utils.py
`run_webserver`). This script does the same thing in-process without the orchestrator, the head
server or Ray: it writes a minimal global config (the shipped genrm_compare.yaml values, a
`genrm_model` server entry whose host/port is our simulated judge, and a `head_server` entry that
is never contacted because `run_webserver` builds its ServerClient straight from the injected
config) and then runs the unmodified reference server under uvicorn. The judge is reached the
way the reference always reaches it: ServerClient.post(server_name="genrm_model",
url_path="/v1/responses") resolved through the global config to http://<judge-url>.

The process that prints `REFERENCE_SERVER pid=... port=...` *is* the server (no fork), so the
PID can be pinned with taskset and measured through /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

INSTANCE = "genrm_compare_resources_server"
JUDGE_SERVER = "genrm_model"

# The shipped resources_servers/genrm_compare/configs/genrm_compare.yaml values.
SHIPPED: dict = {
    "entrypoint": "app.py",
    "genrm_model_server": {"type": "responses_api_models", "name": JUDGE_SERVER},
    "num_rollouts_per_prompt": 16,
    "cohort_collection_timeout_s": 1800,
    "cohort_evaluation_timeout_s": 1800,
    "judge_request_timeout_s": 1800,
    "cohort_result_ttl_s": 21600,
    "max_terminal_cohorts": 4096,
    "genrm_responses_create_params": {
        "input": [],
        "max_output_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
    },
    "comparison_strategy": "circular",
    "num_judges_per_comparison": 1,
    "use_principle": False,
    "aggregator_method": "simple_tiebreaker",
    "reasoning_bonus": 0.0,
    "answer_bonus": 0.0,
    "top_percentile": 0.2,
    "group_reasoning_length_penalty_coeff": 0.0,
    "group_answer_length_penalty_coeff": 0.0,
    "group_style_penalty_coeff": 0.0,
    "default_score": 3.0,
    "default_ranking": 3.5,
    "debug_logging": False,
    "genrm_parse_retries": 3,
    "genrm_parse_retry_sleep_s": 0.2,
    "domain": "rlhf",
    "verified": False,
    "description": "GenRM pairwise comparison for RLHF training",
    "value": "Compare multiple candidate responses using GenRM model",
}


def _host_port(text: str) -> tuple[str, int]:
    text = text.removeprefix("http://").rstrip("/")
    host, _, port = text.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise argparse.ArgumentTypeError("only loopback judges are allowed (127.0.0.1:PORT)")
    return "127.0.0.1", int(port)


def build_global_config(args: argparse.Namespace) -> dict:
    judge_host, judge_port = args.judge_url
    server = dict(SHIPPED)
    server.update(
        host="127.0.0.1",
        port=args.port,
        num_rollouts_per_prompt=args.num_rollouts,
        comparison_strategy=args.comparison_strategy,
        num_judges_per_comparison=args.num_judges,
        genrm_parse_retries=args.parse_retries,
        genrm_parse_retry_sleep_s=args.retry_sleep_s,
        judge_request_timeout_s=args.judge_timeout_s,
        cohort_collection_timeout_s=args.collection_timeout_s,
        cohort_evaluation_timeout_s=args.evaluation_timeout_s,
        debug_logging=args.debug_logging,
    )
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants key=value, got {item!r}")
        server[key] = yaml.safe_load(value)
    return {
        # Never contacted: run_webserver builds its ServerClient from this dict directly.
        "head_server": {"host": "127.0.0.1", "port": args.head_port},
        "dry_run": False,
        "uvicorn_logging_show_200_ok": args.access_log,
        INSTANCE: {"resources_servers": {"genrm_compare": server}},
        JUDGE_SERVER: {
            "responses_api_models": {
                "genrm_model": {
                    "entrypoint": "app.py",
                    "host": judge_host,
                    "port": judge_port,
                    "model": "genrm-sim",
                }
            }
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--judge-url", type=_host_port, required=True, help="127.0.0.1:PORT")
    parser.add_argument("--num-rollouts", type=int, default=16)
    parser.add_argument(
        "--comparison-strategy", choices=["circular", "all_pairs"], default="circular"
    )
    parser.add_argument("--num-judges", type=int, default=1)
    parser.add_argument("--parse-retries", type=int, default=3)
    parser.add_argument("--retry-sleep-s", type=float, default=0.2)
    parser.add_argument("--judge-timeout-s", type=float, default=1800.0)
    parser.add_argument("--collection-timeout-s", type=float, default=1800.0)
    parser.add_argument("--evaluation-timeout-s", type=float, default=1800.0)
    parser.add_argument("--debug-logging", action="store_true")
    parser.add_argument("--access-log", action="store_true", help="uvicorn 200 OK access log")
    parser.add_argument("--head-port", type=int, default=11000, help="unused placeholder")
    parser.add_argument("--set", action="append", default=[], help="extra server key=yaml-value")
    parser.add_argument("--print-config", action="store_true", help="print the config and exit")
    args = parser.parse_args(argv)

    config = build_global_config(args)
    if args.print_config:
        print(yaml.safe_dump(config, sort_keys=False))
        return

    os.environ["NEMO_GYM_CONFIG_DICT"] = yaml.safe_dump(config, sort_keys=False)
    os.environ["NEMO_GYM_CONFIG_PATH"] = INSTANCE
    # Keep the reference hermetic: no telemetry exporters, no Ray.
    for name in list(os.environ):
        if name.startswith("NEMO_GYM_OTEL") or name.startswith("OTEL_"):
            del os.environ[name]

    print(
        "REFERENCE_SERVER "
        + json.dumps(
            {
                "pid": os.getpid(),
                "port": args.port,
                "judge": f"{config[JUDGE_SERVER]['responses_api_models']['genrm_model']['host']}:"
                f"{config[JUDGE_SERVER]['responses_api_models']['genrm_model']['port']}",
                "num_rollouts": args.num_rollouts,
            }
        ),
        flush=True,
    )
    from resources_servers.genrm_compare.app import GenRMCompareResourcesServer

    GenRMCompareResourcesServer.run_webserver()


if __name__ == "__main__":
    sys.exit(main())
