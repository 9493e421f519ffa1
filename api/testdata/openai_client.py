"""Drives `shardd api` with the official openai package (TestOpenAIClient).

  openai_client.py --base URL/v1 --key KEY --model ID --workers-metrics A,B

The server must run with --max-inflight 1 --max-queue 1 and --api-keys
holding KEY, over a route of SmolLM2 (an instruct model with a chat
template). Each check prints "ok: NAME"; the first that fails raises, and
the script exits non-zero with the reason.
"""

import argparse
import json
import threading
import time
import urllib.request

import urllib.error

import openai

p = argparse.ArgumentParser()
p.add_argument("--base", required=True)
p.add_argument("--key", required=True)
p.add_argument("--model", required=True)
p.add_argument("--workers-metrics", required=True)
args = p.parse_args()

client = openai.OpenAI(base_url=args.base, api_key=args.key, max_retries=0, timeout=120)
root = args.base.rsplit("/v1", 1)[0]


def post(path, body, key=None):
    """(status, parsed JSON body) of a raw POST: bodies the client cannot send."""
    req = urllib.request.Request(args.base + path, data=body, method="POST", headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def ok(name):
    print("ok:", name, flush=True)


def metric(addr, name):
    """The value of an unlabelled metric on a Prometheus page."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{addr} has no metric {name}")


def worker_sessions():
    return [metric(a, "shardd_sessions") for a in args.workers_metrics.split(",")]


def wait(cond, what, timeout=15):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def chat(content, **kw):
    return client.chat.completions.create(model=args.model, messages=[{"role": "user", "content": content}], **kw)


def streamed_chat(content, **kw):
    """(text, chunks' texts, role, finish reason, usage) of a streamed chat."""
    texts, role, finish, usage = [], None, None, None
    for c in chat(content, stream=True, stream_options={"include_usage": True}, **kw):
        if c.usage is not None:
            assert c.choices == [], "the usage chunk carries no choices"
            usage = c.usage
            continue
        d = c.choices[0].delta
        if d.role:
            assert role is None and not texts, "the role comes first, once"
            role = d.role
        if d.content:
            texts.append(d.content)
        if c.choices[0].finish_reason:
            finish = c.choices[0].finish_reason
    return "".join(texts), texts, role, finish, usage


# /v1/models
models = client.models.list().data
assert [m.id for m in models] == [args.model], [m.id for m in models]
ok("models")

# Chat, whole and streamed: the same text, the role first, the finish
# reason last, the usage after it.
q = "What is the capital of France?"
whole = chat(q, temperature=0, max_tokens=32)
text = whole.choices[0].message.content
assert "Paris" in text, text
assert whole.choices[0].message.role == "assistant"
assert whole.choices[0].finish_reason == "stop", whole.choices[0].finish_reason
assert whole.usage.prompt_tokens > 5 and 0 < whole.usage.completion_tokens < 32, whole.usage
assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-") and whole.model == args.model
s_text, _, role, finish, usage = streamed_chat(q, temperature=0, max_tokens=32)
assert s_text == text, (s_text, text)
assert role == "assistant" and finish == "stop", (role, finish)
assert usage.completion_tokens == whole.usage.completion_tokens and usage.prompt_tokens == whole.usage.prompt_tokens, usage
ok("chat, whole and streamed, with usage")

# max_tokens reached: finish_reason length, every token counted.
short = chat(q, temperature=0, max_tokens=3)
assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3, short
assert text.startswith(short.choices[0].message.content), (short.choices[0].message.content, text)
ok("chat, length")

# Completions, whole and streamed.
prompt = "The capital of France is"
comp = client.completions.create(model=args.model, prompt=prompt, temperature=0, max_tokens=12)
ctext = comp.choices[0].text
assert comp.object == "text_completion" and comp.choices[0].finish_reason == "length", comp
assert comp.usage.completion_tokens == 12, comp.usage
parts, cusage, cfinish = [], None, None
for c in client.completions.create(model=args.model, prompt=prompt, temperature=0, max_tokens=12, stream=True,
                                   stream_options={"include_usage": True}):
    if c.usage is not None:
        cusage = c.usage
    for ch in c.choices:
        parts.append(ch.text)
        cfinish = ch.finish_reason or cfinish
assert "".join(parts) == ctext, (parts, ctext)
assert cfinish == "length" and cusage.completion_tokens == 12, (cfinish, cusage)
# A prompt of token ids answers as its text does.
first = comp.choices[0].text
ids_comp = client.completions.create(model=args.model, prompt=[1, 504, 3575, 282, 4649, 314], temperature=0, max_tokens=2)
assert ids_comp.usage.prompt_tokens == 6 and ids_comp.usage.completion_tokens == 2, ids_comp.usage
ok("completions, whole and streamed, with usage")

# A stop string that spans tokens: found, and none of it sent.
stop = ctext[3:9]
assert len(stop.strip()) >= 3, ctext
want = ctext[: ctext.index(stop)]
got = client.completions.create(model=args.model, prompt=prompt, temperature=0, max_tokens=12, stop=[stop, "zzzz"])
assert got.choices[0].text == want and got.choices[0].finish_reason == "stop", (got.choices[0].text, want, stop)
sparts = [c.choices[0].text for c in client.completions.create(
    model=args.model, prompt=prompt, temperature=0, max_tokens=12, stop=stop, stream=True) if c.choices]
assert "".join(sparts) == want, (sparts, want)
ok("stop string %r spanning tokens" % stop)

# Unicode through a stream: answers that cross multi-byte characters
# decode to the same text streamed and whole, with no replacement
# character anywhere (a chunk never ends inside a character).
for q2 in ["Reply with three emoji that describe happiness.", "Translate to Chinese: Good morning, my friend."]:
    w = chat(q2, temperature=0, max_tokens=40).choices[0].message.content
    s, chunks, _, _, _ = streamed_chat(q2, temperature=0, max_tokens=40)
    assert any(ord(ch) > 0x2FFF for ch in w), "no multi-byte answer to test with: %r" % w
    assert s == w, (s, w)
    assert all("\ufffd" not in c for c in chunks), chunks
ok("unicode: emoji and CJK streamed as whole")

# 401: a wrong key and no key.
try:
    openai.OpenAI(base_url=args.base, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401 and e.body["code"] == "invalid_api_key", e.body
st, body = post("/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
assert st == 401 and body["error"]["type"] == "invalid_request_error", (st, body)
ok("401")

# Bad bodies: each a 400 that names its field.
bad = [
    ("n", dict(n=2)),
    ("tools", dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])),
    ("logprobs", dict(logprobs=True)),
    ("frobnicate", dict(extra_body={"frobnicate": 1})),
    ("max_tokens", dict(extra_body={"max_tokens": "many"})),
    ("temperature", dict(temperature=5)),
    ("messages[0].role", dict(extra_body={"messages": [{"role": "wizard", "content": "x"}]})),
    ("stream_options", dict(stream_options={"include_usage": True})),
]
for field, kw in bad:
    try:
        chat("hi", max_tokens=2, **kw)
        raise AssertionError("accepted a body with a bad " + field)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == field and field in e.message, (field, e.body)
for field, kw in [("best_of", dict(best_of=2)), ("echo", dict(echo=True)), ("suffix", dict(suffix="x")),
                  ("prompt", dict(extra_body={"prompt": ["a", "b"]}))]:
    try:
        client.completions.create(model=args.model, prompt="hi", max_tokens=2, **kw)
        raise AssertionError("accepted a body with a bad " + field)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == field, (field, e.body)
for raw, field in [(b'{"messages": [', None), (b'{"model": "x"}', "messages"), (b"[1,2]", None)]:
    st, body = post("/chat/completions", raw, args.key)
    assert st == 400 and body["error"]["param"] == field, (raw, st, body)
ok("bad bodies: 400 naming the field")

# A client that disconnects: its generation is cancelled and the workers
# release its session.
assert worker_sessions() == [0.0, 0.0], worker_sessions()
stream = chat(q, stream=True, max_tokens=400, temperature=0, extra_body={"ignore_eos": True})
seen = 0
for c in stream:
    if c.choices and c.choices[0].delta.content:
        seen += 1
    if seen == 3:
        break
assert min(worker_sessions()) >= 1, worker_sessions()
stream.close()
wait(lambda: worker_sessions() == [0.0, 0.0], "the workers to release the disconnected session")
ok("disconnect releases the workers' sessions")

# 429: one generation in flight, one queued, the next refused with
# Retry-After.
def hold(out):
    try:
        s = chat(q, stream=True, max_tokens=300, temperature=0, extra_body={"ignore_eos": True})
        out.append(s)
        for _ in s:
            pass
    except Exception as e:  # closed from the main thread
        out.append(e)


held = []
threads = [threading.Thread(target=hold, args=(held,), daemon=True) for _ in range(2)]
threads[0].start()
wait(lambda: metric(root.split("://", 1)[1], "shardd_api_requests_inflight") == 1, "a request in flight")
threads[1].start()
wait(lambda: metric(root.split("://", 1)[1], "shardd_api_requests_queued") == 1, "a request queued")
try:
    chat(q, max_tokens=2)
    raise AssertionError("a request past the queue was accepted")
except openai.RateLimitError as e:
    assert e.status_code == 429 and e.response.headers.get("retry-after") == "1", (e.status_code, e.response.headers)
for s in held:
    if hasattr(s, "close"):
        s.close()
for t in threads:
    t.join(timeout=120)
wait(lambda: worker_sessions() == [0.0, 0.0], "the workers to release the held sessions", timeout=60)
ok("429 with Retry-After past the queue")
print("all checks passed", flush=True)
