#!/usr/bin/env bash
# One command from a fresh machine to an answer: installs the host packages, builds sandboxd,
# builds the sandbox image offline, then runs the agent on the task given as arguments.
#   scripts/quickstart.sh "Plot sin(x) to /workspace/sin.png and describe it"
# The LLM comes from OPENAI_API_KEY / OPENAI_BASE_URL / SANDBOXD_LLM_MODEL or config/sandboxd.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/host-deps.sh
cargo build --release --locked
./target/release/sandboxd image build
if [ $# -gt 0 ]; then
    exec ./target/release/sandboxd run --prompt "$*"
fi
./target/release/sandboxd doctor || true
echo "ready: ./target/release/sandboxd run --prompt \"your task\""
