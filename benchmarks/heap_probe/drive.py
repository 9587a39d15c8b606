"""8 agents of multi-turn chats (half streamed, 3% of streams cut) against heap_probe/serve.py for
ARGV[1] seconds."""

import concurrent.futures as cf
import random
import sys
import time

import openai

dur = float(sys.argv[1])


def agent(k):
    c = openai.OpenAI(base_url="http://127.0.0.1:8141/v1", api_key="x", max_retries=0, timeout=120)
    rng = random.Random(k)
    end = time.time() + dur
    n = 0
    while time.time() < end:
        msgs = [{"role": "system", "content": f"agent {k} " * 50}]
        for _ in range(rng.randint(2, 8)):
            msgs.append(
                {"role": "user", "content": " ".join(str(rng.random()) for _ in range(rng.randint(5, 80)))}
            )
            try:
                if rng.random() < 0.5:
                    r = c.chat.completions.create(
                        model="flashstate-tiny",
                        messages=msgs,
                        max_tokens=16,
                        temperature=0,
                        extra_body={"ignore_eos": True},
                    )
                    text = r.choices[0].message.content
                else:
                    s = c.chat.completions.create(
                        model="flashstate-tiny",
                        messages=msgs,
                        max_tokens=16,
                        temperature=0,
                        stream=True,
                        extra_body={"ignore_eos": True},
                    )
                    text = ""
                    for ch in s:
                        if ch.choices and ch.choices[0].delta.content:
                            text += ch.choices[0].delta.content
                        if rng.random() < 0.03:
                            s.close()
                            break
            except Exception:
                text = ""
            msgs.append({"role": "assistant", "content": text})
            n += 1
    return n


with cf.ThreadPoolExecutor(8) as ex:
    print(sum(ex.map(agent, range(8))))
