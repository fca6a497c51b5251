#!/usr/bin/env python3
"""One answer whatever the load, checked the way a user sees it: over HTTP.

For each checkpoint given, starts `minnow serve` on it (the device and parallelism given), then
sends the same greedy chat completions four ways and compares the answers' text:
  1. one at a time (cold cache),
  2. all at once (batched together),
  3. one at a time again (warm: the prefix cache now holds every prompt),
  4. all at once again, each beside a long-prompt request that prefills while they decode.
Prints one line per checkpoint and exits non-zero if any answer differs from its first one.
Standard library only (runs on the device machine without pip).

  python3 scripts/device/http_invariance.py --minnow bin/minnow --device cuda DIR [DIR ...]
"""

import argparse
import concurrent.futures
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "What is the capital of France?",
    "Explain recursion in one sentence.",
    "Name a color.",
    "Count from one to ten.",
    "Say hello in Spanish.",
    "Describe a cat.",
    "Give me a word that rhymes with tree.",
    "What is two plus two?",
    "Tell me a short story about a robot who learns to paint pictures of the moon.",
    "Summarize the plot of a fairy tale.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=300):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)["choices"][0]
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read().decode(errors='replace')}") from None


def ask(port, prompt, max_tokens, chat=True):
    """A greedy answer: chat completions, or raw completions for a checkpoint without a chat
    template."""
    if chat:
        body, path = {"messages": [{"role": "user", "content": prompt}]}, "/v1/chat/completions"
    else:
        body, path = {"prompt": prompt}, "/v1/completions"
    body.update({"temperature": 0, "max_tokens": max_tokens})
    choice = post(port, path, body)
    return choice["message"]["content"] if chat else choice["text"]


def long_prompt(i):
    words = " ".join(f"item{i}-{j}" for j in range(50))
    return f"Repeat the last word of this list: {words}"


def check(args, model):
    port = free_port()
    cmd = [args.minnow, "serve", "--model", model, "--device", args.device,
           "--listen", f"127.0.0.1:{port}", "--parallel", str(args.parallel)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{args.log}", "a"))
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"server on {model} did not become ready (see {args.log})")
            time.sleep(0.3)
        n = args.max_tokens
        chat = True
        try:
            ask(port, "Is there a chat template?", 1)  # not one of PROMPTS: they stay cold
        except RuntimeError as e:
            if "no chat template" not in str(e):
                raise
            chat = False
        cold = [ask(port, p, n, chat) for p in PROMPTS]
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS) + 4) as pool:
            together = list(pool.map(lambda p: ask(port, p, n, chat), PROMPTS))
        warm = [ask(port, p, n, chat) for p in PROMPTS]
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS) + 4) as pool:
            longs = [pool.submit(ask, port, long_prompt(i), 8, chat) for i in range(3)]
            beside = list(pool.map(lambda p: ask(port, p, n, chat), PROMPTS))
            for f in longs:
                f.result()
        differ = {
            "together": sum(a != b for a, b in zip(cold, together)),
            "warm": sum(a != b for a, b in zip(cold, warm)),
            "beside long prefills": sum(a != b for a, b in zip(cold, beside)),
        }
        name = model.rstrip("/").split("/")[-1]
        api = "chat" if chat else "completions"
        print(f"{name} ({args.device}, --parallel {args.parallel}, {api}): "
              + ", ".join(f"{k} {v}/{len(PROMPTS)} differ" for k, v in differ.items())
              + f"; first answer {cold[0][:40]!r}")
        return sum(differ.values())
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minnow", default="bin/minnow")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--log", default="/tmp/http_invariance.log")
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    bad = sum(check(args, m) for m in args.models)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
