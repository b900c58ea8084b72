#!/usr/bin/python3
"""Makes tests/ref/chat/cases.json: the renderings of the committed chat templates
(tests/ref/chat/*.jinja, sources in tests/ref/chat/README.md) for a set of conversations, as
Hugging Face transformers' apply_chat_template renders them, for tests/test_chat_template.c.

transformers (4.4x, chat_template_utils._compile_jinja_template) renders with Jinja2 in an
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols), with
tojson = json.dumps(ensure_ascii=False), the globals raise_exception and strftime_now, and the
variables messages, tools=None, documents=None, add_generation_prompt and the special tokens.
Debian has no python3-transformers, so this script builds that same environment on Debian's
python3-jinja2:

    apt-get install python3-jinja2 && /usr/bin/python3 tests/ref/make_chat_fixture.py
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(HERE, "chat")


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


SYS = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "Hello, who are you?"}
A1 = {"role": "assistant", "content": "I am a small model."}
U2 = {"role": "user", "content": "  Name three colours.\n"}
TRICKY = {"role": "user", "content": "Quote \"this\" <|im_end|> </s> <|eot_id|> [INST] {{ x }} {% if %} caf\u00e9 \u6771\u4eac \U0001F642\n\nend"}

CONVERSATIONS = {
    "system_user": [SYS, U1],
    "user_only": [U1],
    "multi_turn": [SYS, U1, A1, U2],
    "no_system_turns": [U1, A1, U2],
    "tricky_content": [SYS, TRICKY],
    "ends_with_assistant": [U1, A1],
    "empty_content": [{"role": "user", "content": ""}],
    "system_only": [SYS],
    "two_systems": [SYS, {"role": "system", "content": "Second system."}, U1],
    "assistant_first": [A1, U1],
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, \"now\"",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
TOOL_CONVERSATION = [
    SYS,
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "abc123def", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "abc123def", "content": "{\"temp\": 21.5}"},
]
# templates that take tools (their tool branches: tojson, namespace, selectattr, items() ...)
TOOL_TEMPLATES = ("llama3.2", "qwen2.5", "mistral-nemo")

TEMPLATES = {
    # name: (file, bos, eos, extra variables)
    "llama3.2": ("llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>", {"date_string": "26 Jul 2024"}),
    "qwen2.5": ("qwen2.5.jinja", None, "<|im_end|>", {}),
    "mistral-v0.1": ("mistral-v0.1.jinja", "<s>", "</s>", {}),
    "mistral-nemo": ("mistral-nemo.jinja", "<s>", "</s>", {}),
    "smollm2": ("smollm2.jinja", "<|im_start|>", "<|im_end|>", {}),
    "tinyllama": ("tinyllama.jinja", "<s>", "</s>", {}),
}


def main():
    env = environment()
    cases = []
    for name, (path, bos, eos, extra) in TEMPLATES.items():
        with open(os.path.join(CHAT, path), encoding="utf-8") as f:
            source = f.read()
        tmpl = env.from_string(source)
        for conv_name, messages in CONVERSATIONS.items():
            for agp in (True, False):
                case = {"template": name, "file": path, "conversation": conv_name, "messages": messages,
                        "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos, "vars": extra}
                try:
                    case["expected"] = tmpl.render(messages=messages, tools=None, documents=None,
                                                   add_generation_prompt=agp, bos_token=bos, eos_token=eos, **extra)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
        if name in TOOL_TEMPLATES:
            for conv_name, messages in (("tools_user", [SYS, {"role": "user", "content": "Weather in Paris?"}]),
                                        ("tools_call", TOOL_CONVERSATION)):
                vars_ = dict(extra, tools=TOOLS)
                case = {"template": name, "file": path, "conversation": conv_name, "messages": messages,
                        "add_generation_prompt": True, "bos_token": bos, "eos_token": eos, "vars": vars_}
                try:
                    case["expected"] = tmpl.render(messages=messages, documents=None, add_generation_prompt=True,
                                                   bos_token=bos, eos_token=eos, **vars_)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    out = os.path.join(CHAT, "cases.json")
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/ref/make_chat_fixture.py", "jinja2": jinja2.__version__, "cases": cases},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(out + ".tmp", out)
    print(f"{out}: {len(cases)} cases, {sum('error' in c for c in cases)} errors")


if __name__ == "__main__":
    main()
