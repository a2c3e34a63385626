"""mlx-lm's tool-call parsers as the oracle for constrained tool calls.

Reads a JSON list of cases from stdin, each {"module": mlx-lm's parser module or null,
"sections": [the text of each tool-call section, markers removed], "tools": [OpenAI
function tools]}; writes a JSON list with, per case, {"calls": [{"name", "arguments"}]}
as mlx-lm's parser reads them (null without a module), and "invalid": the first call
whose name is no tool or whose arguments fail the tool's parameter schema (Python's
jsonschema), or null.
"""
import importlib
import json
import sys

import jsonschema


def main():
    cases = json.load(sys.stdin)
    out = []
    for case in cases:
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in case["tools"]}
        calls = None
        if case["module"]:
            mod = importlib.import_module(f"mlx_lm.tool_parsers.{case['module']}")
            calls = []
            for text in case["sections"]:
                got = mod.parse_tool_call(text, case["tools"])
                calls.extend(got if isinstance(got, list) else [got])
            calls = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
        invalid = None
        for c in calls or case.get("ours", []):
            if c["name"] not in schemas:
                invalid = f"unknown tool {c['name']}"
                break
            try:
                jsonschema.validate(c["arguments"], schemas[c["name"]])
            except jsonschema.ValidationError as e:
                invalid = f"{c['name']}: {e.message} in {c['arguments']}"
                break
        out.append({"calls": calls, "invalid": invalid})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
