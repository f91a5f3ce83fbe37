"""python -m tools.local_llm ensure | serve --port N | status | env --port N"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import LocalLLMError, available, ensure, llm_env, server_command
from .config import MODEL_LICENSE, LocalLLMConfig


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.local_llm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ensure", help="download the model and build llama-cpp-python, once")
    serve = sub.add_parser("serve", help="run the OpenAI-compatible server in the foreground")
    serve.add_argument("--port", type=int, default=8080)
    sub.add_parser("status", help="what is cached, as JSON")
    env = sub.add_parser("env", help="the DECKHANDS_LLM_* variables that point at the server")
    env.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    config = LocalLLMConfig.from_env()

    if args.command == "ensure":
        started = time.monotonic()
        try:
            path = ensure(config, say=lambda line: print(f"local-llm: {line}", flush=True))
        except LocalLLMError as exc:
            sys.exit(f"local-llm: FAILED: {exc}")
        print(f"local-llm: ready in {time.monotonic() - started:.0f}s: {path} ({MODEL_LICENSE})")
    elif args.command == "serve":
        if not available(config):
            sys.exit("local-llm: not set up; run `python -m tools.local_llm ensure` first")
        argv = server_command(args.port, config)
        print(f"local-llm: {' '.join(argv)}", flush=True)
        os.execvp(argv[0], argv)
    elif args.command == "status":
        print(json.dumps({
            "ready": available(config),
            "model": str(config.model_path),
            "model_present": config.model_path.is_file(),
            "wheels": sorted(str(p) for p in config.wheel_dir.rglob("*.whl")),
            "server_command": server_command(8080, config),
        }, indent=2))  # fmt: skip
    else:
        for key, value in llm_env(args.port).items():
            print(f"export {key}={value}")


if __name__ == "__main__":
    main()
