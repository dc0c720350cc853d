#!/usr/bin/env python3
"""A whole coding agent in the standard library: the contract every harness program follows (docs/harness.md).

1. Read the task: the file $UNI_AGENT_PROMPT_FILE (also in $UNI_AGENT_PROMPT). The working directory is the repo.
2. Call the model: POST $OPENAI_BASE_URL/chat/completions with `Authorization: Bearer $OPENAI_API_KEY`, OpenAI's chat
   format, tools as function definitions. The key is this rollout's token; the model is whatever the run serves.
3. Run commands: here, the model's `bash` calls, in a subprocess; their output goes back as `tool` messages.
4. Exit: 0 when the model submits (the patch is the repo's diff after exit); non-zero when giving up. An HTTP error
   from the gateway (403: a budget is spent; 400: the context is full) means the episode is over: exit.

Usage (what the agent config's `harness.command` runs): python3 /opt/example/agent.py [--keep-last N]
--keep-last N sends only the system message, the task and the last N messages (a program that cuts its history:
the row then records a second token chain where the cut happened).
"""

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

SYSTEM = ("You are a software engineer working in a git repository. Use the bash tool to inspect and change files "
          "and to run the tests; call submit when the task is done.")
TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a bash command in the repository.",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Finish: the repository's changes are the answer.",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def chat(messages):
    body = {"model": os.environ.get("UNI_AGENT_MODEL", "default"), "messages": messages, "tools": TOOLS}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=900) as answer:
            return json.load(answer)["choices"][0]["message"]
    except urllib.error.HTTPError as error:  # the episode is over (a budget), or the model failed
        print("model call refused: HTTP %d %s" % (error.code, error.read().decode(errors="replace")), file=sys.stderr)
        sys.exit(2)


def run(command):
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)
        output = "[exit code: %d]\n%s%s" % (done.returncode, done.stdout, done.stderr)
    except subprocess.TimeoutExpired:
        output = "[timed out after 300 s]"
    return output[-8000:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep-last", type=int, default=0, help="send only the last N messages after the task")
    args = parser.parse_args()
    with open(os.environ["UNI_AGENT_PROMPT_FILE"]) as f:
        task = f.read()
    head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    history = []
    while True:  # the gateway ends the episode at the run's call budget
        recent = history
        if args.keep_last and len(history) > args.keep_last:
            recent = history[-args.keep_last:]
            while recent and recent[0]["role"] == "tool":  # a tool result without its call is not valid
                recent = recent[1:]
        reply = chat(head + recent)
        history.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            history.append({"role": "user", "content": "Call a tool: bash to run a command, submit when done."})
        for call in calls:
            name = call["function"]["name"]
            if name == "submit":
                print("submitted")
                return 0
            try:
                command = json.loads(call["function"].get("arguments") or "{}")["command"] if name == "bash" else None
                output = run(command) if command is not None else "unknown tool %r" % name
            except (ValueError, KeyError, TypeError) as error:
                command, output = None, "bad arguments: %s" % error
            print("$ %s" % (command or name), flush=True)
            history.append({"role": "tool", "tool_call_id": call["id"], "content": output})


if __name__ == "__main__":
    sys.exit(main())
