"""Checks mlx-server's structured output with the official SDKs and an independent
validator (Python's `jsonschema`).

    python xtask/py/structured_clients.py --base-url http://127.0.0.1:8080 [--tools]

Validity as a property: for a set of schemas (nested objects, arrays with bounds,
enums, anyOf, $ref, string formats, number ranges) every answer must parse and validate,
non-streaming, streaming, and with --concurrency requests at once (default 32). The
schemas bound every string so that a random-weight model, which never "wants" to close
a string, still ends. Also: regex / choice / Lark / GBNF extensions, the OpenAI SDK's
`chat.completions.parse` and `responses.parse` with a Pydantic model, errors (400 naming
the problem), unconstrained answers unchanged next to constrained ones, and with --tools
(a model whose template uses `<tool_call>` JSON) forced tool calls through OpenAI's
`tool_choice` and the Anthropic SDK's forced tool use; without --tools, forcing a tool
must be a 400 naming the unsupported format.

Missing packages (openai, anthropic, jsonschema) are installed with pip when absent
(scripts/setup.sh pins jsonschema). Exits 0 when every check passes.
"""

import argparse
import concurrent.futures as cf
import importlib
import json
import re
import subprocess
import sys

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 10},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array_bounds": {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 100},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "value": {
                "anyOf": [
                    {"type": "integer", "minimum": -5, "maximum": 5},
                    {"type": "boolean"},
                    {"type": "string", "maxLength": 6},
                ]
            }
        },
        "required": ["value"],
        "additionalProperties": False,
    },
    "refs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "y": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "formats": {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["day", "id"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            # multipleOf bounds the fraction digits: a random-weight model would
            # otherwise write zeros after the point until max_tokens.
            "t": {"type": "number", "minimum": -1.5, "maximum": 2.5, "multipleOf": 0.5},
            "n": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000},
        },
        "required": ["t", "n"],
        "additionalProperties": False,
    },
}


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


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def user(text):
    return [{"role": "user", "content": text}]


MAX_TOKENS = 400


def fmt(name):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def ask(oa, name, seed, stream):
    kw = dict(
        model="default_model",
        messages=user(f"Answer in JSON ({name})."),
        response_format=fmt(name),
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=seed,
    )
    if not stream:
        c = oa.chat.completions.create(**kw).choices[0]
        return c.message.content, c.finish_reason
    text, finish = "", None
    for chunk in oa.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


def validate(js, name, text, finish):
    expect(finish == "stop", f"{name}: finish_reason {finish} for {text!r}")
    try:
        value = json.loads(text)
    except ValueError as e:
        raise AssertionError(f"{name}: not JSON ({e}): {text!r}")
    try:
        js.validate(value, SCHEMAS[name], format_checker=js.FormatChecker())
    except js.ValidationError as e:
        raise AssertionError(f"{name}: {e.message} in {text!r}")


def schemas_validate(oa, an, js, args):
    for name in SCHEMAS:
        for seed in range(2):
            for stream in (False, True):
                validate(js, name, *ask(oa, name, seed, stream), )


def schemas_validate_concurrently(oa, an, js, args):
    jobs = [(name, seed, seed % 2 == 1) for seed in range(args.concurrency) for name in [list(SCHEMAS)[seed % len(SCHEMAS)]]]
    with cf.ThreadPoolExecutor(args.concurrency) as pool:
        futures = {pool.submit(ask, oa, n, s, st): n for n, s, st in jobs}
        for f in cf.as_completed(futures):
            validate(js, futures[f], *f.result())


def unconstrained_answers_unchanged(oa, an, js, args):
    def plain():
        r = oa.chat.completions.create(model="default_model", messages=user("Say something."), temperature=0, max_tokens=24)
        return r.choices[0].message.content

    alone = plain()
    with cf.ThreadPoolExecutor(8) as pool:
        constrained = [pool.submit(ask, oa, n, 7, False) for n in list(SCHEMAS)[:6]]
        together = [pool.submit(plain) for _ in range(2)]
        for f in constrained:
            f.result()
        for f in together:
            expect(f.result() == alone, f"{f.result()!r} next to constrained rows vs {alone!r} alone")


def extensions(oa, an, js, args):
    def chat(**extra):
        r = oa.chat.completions.create(
            model="default_model", messages=user("Pick."), max_tokens=64, temperature=1.0, seed=3, extra_body=extra
        )
        return r.choices[0].message.content

    t = chat(guided_regex=r"[0-9]{3}-[a-z]{2}")
    expect(re.fullmatch(r"[0-9]{3}-[a-z]{2}", t), f"guided_regex {t!r}")
    t = chat(guided_choice=["alpha", "beta gamma"])
    expect(t in ("alpha", "beta gamma"), f"guided_choice {t!r}")
    t = chat(structured_outputs={"choice": ["x1", "y2"]})
    expect(t in ("x1", "y2"), f"structured_outputs.choice {t!r}")
    t = chat(guided_grammar='start: "n=" /[1-9]/ ("," /[1-9]/){0,2}\n')
    expect(re.fullmatch(r"n=[1-9](,[1-9]){0,2}", t), f"guided_grammar (Lark) {t!r}")
    t = chat(grammar='root ::= "ok " answer\nanswer ::= ("yes" | "no") [!.]\n')
    expect(re.fullmatch(r"ok (yes|no)[!.]", t), f"grammar (GBNF) {t!r}")
    t = chat(guided_json=SCHEMAS["enums"])
    validate(js, "enums", t, "stop")
    t = chat(json_schema=SCHEMAS["refs"])
    validate(js, "refs", t, "stop")
    r = oa.completions.create(
        model="default_model", prompt="JSON:", max_tokens=MAX_TOKENS, temperature=1.0, seed=1,
        extra_body={"guided_json": SCHEMAS["array_bounds"]},
    )
    validate(js, "array_bounds", r.choices[0].text, r.choices[0].finish_reason)


def errors_name_the_problem(oa, an, js, args):
    import openai

    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such"}}}}, "response_format"),
        ({"response_format": {"type": "xml"}}, "xml"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
        ({"guided_regex": "[a-"}, "guided_regex"),
        ({"grammar": "root ::= (\n"}, "GBNF"),
        ({"guided_grammar": "start: missing\n"}, "guided_grammar"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "only one"),
        ({"guided_choice": []}, "guided_choice"),
    ]
    for extra, want in cases:
        try:
            oa.chat.completions.create(model="default_model", messages=user("x"), max_tokens=4, extra_body=extra)
        except openai.BadRequestError as e:
            expect(want in str(e), f"{extra}: {e}")
            continue
        raise AssertionError(f"{extra}: no 400")
    # The server keeps serving.
    ask(oa, "enums", 0, False)


def openai_parse_with_pydantic(oa, an, js, args):
    from typing import Annotated, List, Literal

    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: Annotated[str, Field(max_length=10)]
        population: Annotated[int, Field(ge=0, le=10_000_000)]

    class Answer(BaseModel):
        cities: Annotated[List[City], Field(min_length=1, max_length=2)]
        unit: Literal["metric", "imperial"]
        sunny: bool

    parse = getattr(oa.chat.completions, "parse", None) or oa.beta.chat.completions.parse
    r = parse(model="default_model", messages=user("Cities?"), response_format=Answer, max_tokens=MAX_TOKENS, temperature=1.0, seed=2)
    parsed = r.choices[0].message.parsed
    expect(isinstance(parsed, Answer), f"parsed {parsed!r} from {r.choices[0].message.content!r}")
    r = oa.responses.parse(model="default_model", input="Cities?", text_format=Answer, max_output_tokens=MAX_TOKENS, temperature=1.0)
    expect(isinstance(r.output_parsed, Answer), f"responses.parse gave {r.output_parsed!r} from {r.output_text!r}")


TOOL = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit", "days"],
        "additionalProperties": False,
    },
}
OTHER = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}


def openai_tool_choice(oa, an, js, args):
    import openai

    tools = [{"type": "function", "function": TOOL}, {"type": "function", "function": OTHER}]
    kw = dict(model="default_model", messages=user("Weather in Paris?"), tools=tools, max_tokens=MAX_TOKENS, temperature=1.0)
    if not args.tools:
        try:
            oa.chat.completions.create(tool_choice="required", **kw)
        except openai.BadRequestError as e:
            expect("tool-call format" in str(e), str(e))
            return
        raise AssertionError("tool_choice required: no 400 for a model without a <tool_call> format")
    schemas = {"get_weather": TOOL["parameters"], "get_time": OTHER["parameters"]}
    for seed in range(3):
        for choice, parallel in (("required", True), ("required", False), ({"type": "function", "function": {"name": "get_time"}}, True)):
            r = oa.chat.completions.create(tool_choice=choice, parallel_tool_calls=parallel, seed=seed, **kw)
            calls = r.choices[0].message.tool_calls or []
            expect(calls, f"no tool call: {r.choices[0].message}")
            expect(parallel or len(calls) == 1, f"{len(calls)} calls with parallel_tool_calls false")
            for c in calls:
                if isinstance(choice, dict):
                    expect(c.function.name == "get_time", c.function.name)
                js.validate(json.loads(c.function.arguments), schemas[c.function.name])


def anthropic_forced_tool_use(oa, an, js, args):
    import anthropic

    tool = {"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}
    kw = dict(model="default_model", max_tokens=MAX_TOKENS, messages=user("Weather in Paris?"), tools=[tool])
    if not args.tools:
        try:
            an.messages.create(tool_choice={"type": "any"}, **kw)
        except anthropic.BadRequestError as e:
            expect("tool-call format" in str(e), str(e))
            return
        raise AssertionError("tool_choice any: no 400 for a model without a <tool_call> format")
    # One call each: with parallel calls allowed a random-weight model rarely stops
    # calling (OpenAI's parallel case is checked above without a finish condition).
    for choice in (
        {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        {"type": "any", "disable_parallel_tool_use": True},
    ):
        r = an.messages.create(tool_choice=choice, **kw)
        uses = [b for b in r.content if b.type == "tool_use"]
        expect(uses and r.stop_reason == "tool_use", f"content {r.content}, stop {r.stop_reason}")
        for u in uses:
            expect(u.name == "get_weather", u.name)
            js.validate(u.input, TOOL["parameters"])


CHECKS = [
    schemas_validate,
    schemas_validate_concurrently,
    unconstrained_answers_unchanged,
    extensions,
    errors_name_the_problem,
    openai_parse_with_pydantic,
    openai_tool_choice,
    anthropic_forced_tool_use,
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tools", action="store_true", help="the model's template uses <tool_call> JSON")
    ap.add_argument("--only", default=None, help="run the checks whose name contains this")
    args = ap.parse_args()
    openai, anthropic, js = ensure("openai", "anthropic", "jsonschema")
    key = args.api_key or "unused"
    oa = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key=key, max_retries=0, timeout=600)
    an = anthropic.Anthropic(base_url=args.base_url, api_key=key, max_retries=0, timeout=600)
    checks = [c for c in CHECKS if args.only is None or args.only in c.__name__]
    failed = 0
    for fn in checks:
        try:
            fn(oa, an, js, args)
            print(f"ok   {fn.__name__}", flush=True)
        except Exception as e:  # report every failing check, then fail
            failed += 1
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
    print(f"{len(checks) - failed}/{len(checks)} checks passed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
