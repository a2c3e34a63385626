"""mlx-lm's tool-call parsers as the oracle for constrained tool calls.

Reads a JSON list of cases from stdin, each {"module": mlx-lm's parser module or null,
"sections": [the text of each tool-call section, markers removed], "tools": [OpenAI
function tools]}; writes a JSON list with, per case, {"calls": [{"name", "arguments"}
and "id" where the parser returns one]} as mlx-lm's parser reads them (null without a
module or when it raises: then "error" is the exception), and "invalid": the first call
whose name is no tool or whose arguments fail the tool's parameter schema (Python's
jsonschema), or null (not checked for a case with "check": false).
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
        error = None
        if case["module"]:
            mod = importlib.import_module(f"mlx_lm.tool_parsers.{case['module']}")
            try:
                calls = []
                for text in case["sections"]:
                    got = mod.parse_tool_call(text, case["tools"])
                    calls.extend(got if isinstance(got, list) else [got])
                # The id only where the parser gives one (mlx-lm's server uses it).
                calls = [
                    {"name": c["name"], "arguments": c["arguments"]}
                    | ({"id": c["id"]} if c.get("id") else {})
                    for c in calls
                ]
            except Exception as e:  # what mlx-lm's server drops (or fails on)
                calls = None
                error = f"{type(e).__name__}: {e}"
        invalid = None
        for c in calls or case.get("ours", []) if case.get("check", True) else []:
            if c["name"] not in schemas:
                invalid = f"unknown tool {c['name']}"
                break
            try:
                jsonschema.validate(c["arguments"], schemas[c["name"]])
            except jsonschema.ValidationError as e:
                invalid = f"{c['name']}: {e.message} in {c['arguments']}"
                break
        out.append({"calls": calls, "invalid": invalid, "error": error})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
