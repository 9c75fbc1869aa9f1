"""`python -m speckv.services.cluster.vllm_main ARGS`: vLLM's OpenAI API
server with ARGS, in a process that gets SIGTERM when its launcher dies
(parent_death.py); vllm_servers.py starts it."""
from __future__ import annotations

import os
import runpy
import sys

from speckv.services.cluster.parent_death import die_with_parent


def main() -> None:
    die_with_parent(os.environ)
    sys.argv = ["vllm-openai-api-server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
