"""Checks mlx-server with the official OpenAI and Anthropic Python SDKs.

Run against a server over the scripted test model (crates/mlx-server/tests/common):
it answers "Hello! The answer is 42. Goodbye." by default, a get_weather tool call to
prompts mentioning "weather", and a think section to prompts mentioning "ponder".

    python xtask/py/server_clients.py --base-url http://127.0.0.1:8080 --api-key KEY

With --real-model the checks instead suit a real model (the default SmolLM2-135M): no
fixed answers, but greedy requests must agree with each other across endpoints, streaming
and non-streaming, `stop` must cut the greedy text where the stop string first appears,
and tools must be accepted.

The SDKs are installed with pip into the running interpreter when missing. Exits 0 when
every check passes, 1 (with the failing check) otherwise.
"""

import argparse
import importlib
import json
import subprocess
import sys

ANSWER = "Hello! The answer is 42. Goodbye."
WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            },
        },
    }
]


def ensure(*packages):
    missing = []
    for p in packages:
        try:
            importlib.import_module(p)
        except ImportError:
            missing.append(p)
    if missing:
        print(f"installing {' '.join(missing)} with pip", flush=True)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *missing])
    return [importlib.import_module(p) for p in packages]


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def user(text):
    return [{"role": "user", "content": text}]


@check
def openai_chat(oa, an, base, key):
    r = oa.chat.completions.create(model="default_model", messages=user("hi"))
    c = r.choices[0]
    expect(c.message.content == ANSWER, f"content {c.message.content!r}")
    expect(c.finish_reason == "stop", f"finish {c.finish_reason}")
    expect(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, f"usage {r.usage}")
    expect(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total")
    expect(r.usage.prompt_tokens_details.cached_tokens >= 0, "cached_tokens")


@check
def openai_chat_stream_with_usage(oa, an, base, key):
    stream = oa.chat.completions.create(
        model="default_model",
        messages=user("hi"),
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    expect(text == ANSWER, f"streamed {text!r}")
    expect(finish == "stop", f"finish {finish}")
    expect(usage is not None and usage.completion_tokens > 0, f"usage {usage}")


@check
def openai_stop_is_honoured(oa, an, base, key):
    r = oa.chat.completions.create(model="default_model", messages=user("hi"), stop=["42"])
    expect(r.choices[0].message.content == "Hello! The answer is ", repr(r.choices[0].message.content))
    stream = oa.chat.completions.create(model="default_model", messages=user("hi"), stop="answer", stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    expect(text == "Hello! The ", f"streamed {text!r}")


@check
def openai_max_tokens_gives_length(oa, an, base, key):
    r = oa.chat.completions.create(model="default_model", messages=user("hi"), max_tokens=3)
    expect(r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
    expect(r.usage.completion_tokens == 3, f"usage {r.usage}")


@check
def openai_tool_calls(oa, an, base, key):
    r = oa.chat.completions.create(
        model="default_model", messages=user("weather in Paris?"), tools=OPENAI_TOOLS
    )
    c = r.choices[0]
    expect(c.finish_reason == "tool_calls", c.finish_reason)
    call = c.message.tool_calls[0]
    expect(call.function.name == "get_weather", call.function.name)
    expect(json.loads(call.function.arguments) == WEATHER_ARGS, call.function.arguments)
    # Streamed: accumulate the deltas the way clients do.
    calls = {}
    stream = oa.chat.completions.create(
        model="default_model", messages=user("weather in Paris?"), tools=OPENAI_TOOLS, stream=True
    )
    finish = None
    for chunk in stream:
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                acc = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
                acc["id"] = d.id or acc["id"]
                if d.function and d.function.name:
                    acc["name"] += d.function.name
                if d.function and d.function.arguments:
                    acc["arguments"] += d.function.arguments
    expect(finish == "tool_calls", f"finish {finish}")
    expect(len(calls) == 1 and calls[0]["name"] == "get_weather", f"calls {calls}")
    expect(json.loads(calls[0]["arguments"]) == WEATHER_ARGS, calls[0]["arguments"])
    expect(calls[0]["id"], "tool call id")


@check
def openai_reasoning_content(oa, an, base, key):
    r = oa.chat.completions.create(model="default_model", messages=user("ponder this"))
    msg = r.choices[0].message
    extra = msg.model_extra or {}
    expect("number" in extra.get("reasoning_content", ""), f"reasoning {extra}")
    expect(msg.content.strip() == "Seven.", repr(msg.content))


@check
def openai_completions(oa, an, base, key):
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    r = oa.completions.create(model="default_model", prompt=prompt, max_tokens=50)
    expect(r.choices[0].text == ANSWER, repr(r.choices[0].text))
    expect(r.usage.completion_tokens > 0, "usage")
    stream = oa.completions.create(model="default_model", prompt=prompt, stream=True, stop=["Goodbye"])
    text = "".join(c.choices[0].text for c in stream if c.choices)
    expect(text == "Hello! The answer is 42. ", repr(text))


@check
def openai_responses(oa, an, base, key):
    r = oa.responses.create(model="default_model", input="hi", instructions="Be brief.")
    expect(r.output_text == ANSWER, repr(r.output_text))
    expect(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    tools = [{"type": "function", "name": "get_weather", "parameters": OPENAI_TOOLS[0]["function"]["parameters"]}]
    r = oa.responses.create(model="default_model", input="weather in Paris?", tools=tools)
    calls = [o for o in r.output if o.type == "function_call"]
    expect(calls and calls[0].name == "get_weather", f"output {r.output}")
    expect(json.loads(calls[0].arguments) == WEATHER_ARGS, calls[0].arguments)
    text, kinds = "", []
    for ev in oa.responses.create(model="default_model", input="hi", stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
    expect(text == ANSWER, repr(text))
    expect(kinds[0] == "response.created" and kinds[-1] == "response.completed", f"events {kinds}")


@check
def openai_models_and_errors(oa, an, base, key):
    ids = [m.id for m in oa.models.list().data]
    expect(len(ids) == 1, f"models {ids}")
    mod = sys.modules["openai"]
    try:
        oa.chat.completions.create(model="no/such-model", messages=user("hi"))
        expect(False, "unknown model accepted")
    except mod.NotFoundError:
        pass
    try:
        oa.chat.completions.create(model="default_model", messages=user("hi"), temperature=-1)
        expect(False, "negative temperature accepted")
    except mod.BadRequestError as e:
        expect("temperature" in str(e), str(e))
    bad = mod.OpenAI(base_url=f"{base}/v1", api_key="wrong-key", max_retries=0)
    try:
        bad.models.list()
        expect(key is None, "wrong API key accepted")
    except mod.AuthenticationError:
        expect(key is not None, "authentication error without an API key")


@check
def anthropic_messages(oa, an, base, key):
    r = an.messages.create(model="default_model", max_tokens=100, system="Be brief.", messages=user("hi"))
    expect(r.content[0].type == "text" and r.content[0].text == ANSWER, f"content {r.content}")
    expect(r.stop_reason == "end_turn", r.stop_reason)
    expect(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    r = an.messages.create(model="default_model", max_tokens=100, messages=user("hi"), stop_sequences=["42"])
    expect(r.stop_reason == "stop_sequence" and r.stop_sequence == "42", f"{r.stop_reason} {r.stop_sequence}")
    expect(r.content[0].text == "Hello! The answer is ", repr(r.content[0].text))
    r = an.messages.create(model="default_model", max_tokens=2, messages=user("hi"))
    expect(r.stop_reason == "max_tokens", r.stop_reason)


@check
def anthropic_stream(oa, an, base, key):
    with an.messages.stream(model="default_model", max_tokens=100, messages=user("hi")) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    expect(text == ANSWER, repr(text))
    expect(final.stop_reason == "end_turn", final.stop_reason)
    expect(final.content[0].text == ANSWER, f"final {final.content}")


@check
def anthropic_tools_and_thinking(oa, an, base, key):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]
    r = an.messages.create(model="default_model", max_tokens=200, tools=tools, messages=user("weather in Paris?"))
    expect(r.stop_reason == "tool_use", r.stop_reason)
    uses = [b for b in r.content if b.type == "tool_use"]
    expect(uses and uses[0].name == "get_weather" and uses[0].input == WEATHER_ARGS, f"content {r.content}")
    with an.messages.stream(model="default_model", max_tokens=200, tools=tools, messages=user("weather?")) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    expect(uses and uses[0].input == WEATHER_ARGS, f"streamed content {final.content}")
    # The tool result goes back in the next turn.
    follow = user("weather in Paris?") + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather", "input": WEATHER_ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 C"}]},
    ]
    n = an.messages.count_tokens(model="default_model", messages=follow, tools=tools)
    expect(n.input_tokens > 0, f"count {n}")
    r = an.messages.create(model="default_model", max_tokens=100, messages=user("ponder this"))
    kinds = [b.type for b in r.content]
    expect(kinds == ["thinking", "text"], f"blocks {kinds}")


REAL_CHECKS = []


def real_check(fn):
    REAL_CHECKS.append(fn)
    return fn


QUESTION = "What is the capital of France?"


def greedy_chat(oa, **kw):
    return oa.chat.completions.create(
        model="default_model", messages=user(QUESTION), temperature=0, max_tokens=12, **kw
    )


@real_check
def real_openai_chat_and_stream_agree(oa, an, base, key):
    r = greedy_chat(oa)
    text = r.choices[0].message.content
    expect(text.strip() != "", f"empty answer {text!r}")
    expect(r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
    u = r.usage
    expect(u.prompt_tokens > 0 and u.completion_tokens > 0, f"usage {u}")
    expect(u.total_tokens == u.prompt_tokens + u.completion_tokens, "total")
    streamed, usage = "", None
    for chunk in greedy_chat(oa, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            streamed += c.delta.content or ""
    expect(streamed == text, f"streamed {streamed!r} vs {text!r}")
    expect(usage is not None and usage.completion_tokens == u.completion_tokens, f"usage {usage}")
    again = greedy_chat(oa)
    expect(again.usage.prompt_tokens_details.cached_tokens >= 0, "cached_tokens")
    expect(again.choices[0].message.content == text, "a repeated greedy request differs")


@real_check
def real_openai_stop_is_honoured(oa, an, base, key):
    text = greedy_chat(oa).choices[0].message.content
    words = [w for w in text.split() if len(w) >= 3]
    expect(len(words) >= 2, f"answer too short to pick a stop string: {text!r}")
    stop = words[1]
    want = text[: text.index(stop)]
    r = greedy_chat(oa, stop=[stop])
    expect(r.choices[0].message.content == want, f"{r.choices[0].message.content!r} vs {want!r}")
    expect(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    streamed = "".join(c.choices[0].delta.content or "" for c in greedy_chat(oa, stop=stop, stream=True) if c.choices)
    expect(streamed == want, f"streamed {streamed!r} vs {want!r}")


@real_check
def real_openai_completions(oa, an, base, key):
    prompt = "The capital of France is"
    r = oa.completions.create(model="default_model", prompt=prompt, max_tokens=8, temperature=0)
    text = r.choices[0].text
    expect(text.strip() != "", repr(text))
    expect(r.usage.completion_tokens > 0, f"usage {r.usage}")
    s = oa.completions.create(model="default_model", prompt=prompt, max_tokens=8, temperature=0, stream=True)
    streamed = "".join(c.choices[0].text for c in s if c.choices)
    expect(streamed == text, f"streamed {streamed!r} vs {text!r}")
    r = oa.completions.create(model="default_model", prompt=prompt, max_tokens=3, temperature=0)
    expect(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3, f"{r}")


@real_check
def real_openai_tools_are_accepted(oa, an, base, key):
    r = oa.chat.completions.create(
        model="default_model",
        messages=user("What is the weather in Paris?"),
        tools=OPENAI_TOOLS,
        temperature=0,
        max_tokens=24,
    )
    c = r.choices[0]
    expect(c.finish_reason in ("stop", "length", "tool_calls"), c.finish_reason)
    expect(c.message.content is not None or c.message.tool_calls, f"empty message {c.message}")


@real_check
def real_anthropic_agrees_with_openai(oa, an, base, key):
    # No temperature: the server's default (--temp 0.0, like mlx_lm.server) is greedy.
    text = greedy_chat(oa).choices[0].message.content
    r = an.messages.create(model="default_model", max_tokens=12, messages=user(QUESTION))
    expect(r.content and r.content[0].type == "text", f"content {r.content}")
    expect(r.content[0].text == text, f"{r.content[0].text!r} vs {text!r}")
    expect(r.stop_reason in ("end_turn", "max_tokens"), r.stop_reason)
    expect(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    with an.messages.stream(model="default_model", max_tokens=12, messages=user(QUESTION)) as s:
        streamed = "".join(s.text_stream)
    expect(streamed == text, f"streamed {streamed!r} vs {text!r}")
    n = an.messages.count_tokens(model="default_model", messages=user(QUESTION))
    expect(n.input_tokens == r.usage.input_tokens, f"count {n.input_tokens} vs {r.usage.input_tokens}")


SPEC_CHECKS = []


def spec_check(fn):
    SPEC_CHECKS.append(fn)
    return fn


def spec_greedy(oa, **kw):
    return oa.chat.completions.create(
        model="default_model", messages=user("Tell me a story."), temperature=0, max_tokens=24, **kw
    )


@spec_check
def spec_prediction_keeps_the_answer_and_reports_accepted_tokens(oa, an, base, key):
    plain = spec_greedy(oa, extra_body={"num_draft_tokens": 1}).choices[0].message.content
    for content in (plain, [{"type": "text", "text": plain[:10]}, {"type": "text", "text": plain[10:]}]):
        r = spec_greedy(oa, prediction={"type": "content", "content": content})
        got = r.choices[0].message.content
        expect(got == plain, f"{got!r} vs {plain!r}")
        d = r.usage.completion_tokens_details
        expect(d is not None, f"usage {r.usage}")
        expect(isinstance(d.accepted_prediction_tokens, int) and d.accepted_prediction_tokens > 0, f"details {d}")
        expect(isinstance(d.rejected_prediction_tokens, int) and d.rejected_prediction_tokens >= 0, f"details {d}")
    stream = spec_greedy(
        oa, prediction={"type": "content", "content": plain}, stream=True, stream_options={"include_usage": True}
    )
    text, usage = "", None
    for chunk in stream:
        usage = chunk.usage or usage
        text += "".join(c.delta.content or "" for c in chunk.choices)
    expect(text == plain, f"streamed {text!r} vs {plain!r}")
    expect(usage.completion_tokens_details.accepted_prediction_tokens > 0, f"usage {usage}")


@spec_check
def spec_unknown_draft_model_is_a_400_naming_it(oa, an, base, key):
    import openai

    try:
        spec_greedy(oa, extra_body={"draft_model": "no/such-draft"})
    except openai.BadRequestError as e:
        expect("no/such-draft" in str(e), str(e))
    else:
        raise AssertionError("an unknown draft model was accepted")
    r = spec_greedy(oa)
    expect(r.usage.completion_tokens_details.accepted_draft_tokens >= 0, f"usage {r.usage}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--real-model", action="store_true", help="checks for a real model")
    ap.add_argument("--speculative", action="store_true", help="checks for a server with a draft model")
    args = ap.parse_args()
    checks = SPEC_CHECKS if args.speculative else REAL_CHECKS if args.real_model else CHECKS
    openai, anthropic = ensure("openai", "anthropic")
    key = args.api_key
    oa = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key=key or "unused", max_retries=0, timeout=120)
    an = anthropic.Anthropic(base_url=args.base_url, api_key=key or "unused", max_retries=0, timeout=120)
    failed = 0
    for fn in checks:
        try:
            fn(oa, an, args.base_url, key)
            print(f"ok   {fn.__name__}", flush=True)
        except Exception as e:  # report every failing check, then fail
            failed += 1
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
    print(f"{len(checks) - failed}/{len(checks)} checks passed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
