"""An agent program as people write them: the plain OpenAI SDK, configured by OPENAI_BASE_URL /
OPENAI_API_KEY / OPENAI_MODEL, the task as JSON on stdin, the answer on stdout. It knows nothing
of envrl: a draft, then one revision, then print."""

import json
import os
import sys

from openai import OpenAI


def main() -> None:
    task = json.load(sys.stdin)
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL", "default")
    messages = [{"role": "user", "content": task["question"]}]
    draft = client.chat.completions.create(model=model, messages=messages)
    messages += [
        {"role": "assistant", "content": draft.choices[0].message.content or ""},
        {"role": "user", "content": "Now only the numbers."},
    ]
    final = client.chat.completions.create(model=model, messages=messages)
    print(final.choices[0].message.content or "")


if __name__ == "__main__":
    main()
