"""The subprocess agent of rollout_bench: one chat completion through the gateway, then a reward.

Standard library only (run with `python -S`, which skips the site-packages it doesn't need), so a
rollout costs one interpreter start and one HTTP call. The runner gives it the attempt's endpoint in
OPENAI_BASE_URL / OPENAI_API_KEY and the task in REINFORGE_TASK; the last REINFORGE_REWARD=<float>
line on stdout is the attempt's reward.
"""

import http.client
import json
import os
import urllib.parse

task = json.loads(os.environ.get("REINFORGE_TASK", "{}"))
base = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"].rstrip("/"))
body = json.dumps(
    {
        "model": os.environ.get("OPENAI_MODEL", "policy"),
        "messages": [{"role": "user", "content": f"What is {task.get('a', 2)} + {task.get('b', 2)}?"}],
        "max_tokens": 16,
    }
)
connection = http.client.HTTPConnection(base.hostname or "127.0.0.1", base.port, timeout=60)
connection.request(
    "POST",
    base.path + "/chat/completions",
    body=body,
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
response = connection.getresponse()
reply = json.loads(response.read())
if response.status != 200:
    raise SystemExit(f"the gateway answered {response.status}: {reply}")
answer = reply["choices"][0]["message"]["content"]
print("REINFORGE_REWARD=" + ("1.0" if answer else "0.0"))
