"""Token counts of the mixed Chinese/English cases in crates/core/src/llm/tokens.rs.

Run once by hand (not in CI): python3 -m venv v && v/bin/pip install tiktoken==0.14.0 &&
v/bin/python scripts/tiktoken-counts.py PATH/TO/tiktoken-rs-0.5.9/assets
tiktoken downloads its encoding files at first use; this machine reaches no blob store, so
the files are read from the tiktoken-rs crate instead (the same files: tiktoken's own
constructors, split patterns and special tokens are used unchanged).
"""
import sys

import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public as op

ASSETS = sys.argv[1].rstrip("/") + "/"
_load = tiktoken.load.load_tiktoken_bpe
op.load_tiktoken_bpe = lambda url, expected_hash=None: _load(ASSETS + url.rsplit("/", 1)[-1])

TEXTS = [
    "请用 pandas 读取 sales.xlsx，并计算每个月的 revenue 总和。Then plot it with seaborn.",
    "上下文窗口是 16K tokens；the agent masks old tool outputs first, 然后再总结中间的历史。",
    "Hello, world! 你好，世界！",
]
for name in ["cl100k_base", "o200k_base"]:
    enc = tiktoken.Encoding(**getattr(op, name)())
    for text in TEXTS:
        print(name, len(enc.encode_ordinary(text)), repr(text))
