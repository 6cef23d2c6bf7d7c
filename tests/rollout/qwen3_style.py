"""A copy of the tiny model whose chat template renders tools in Qwen3's form (the tools as JSON
in the system turn, calls as `<tool_call>` blocks, results as `<tool_response>` blocks in a user
turn), written here after Qwen3's template without its thinking parts: the model hub is out of
reach, and the tiny model's tokenizer shares Qwen's special tokens."""

from __future__ import annotations

import shutil
from pathlib import Path

QWEN3_STYLE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if loop.first and message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set fn = call.function if call.function else call %}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{{- fn.arguments if fn.arguments is string else fn.arguments | tojson }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def qwen3_style_model(tiny_model: str, dest: Path) -> str:
    """`tiny_model` copied to `dest`, its tokenizer's chat template replaced by the one above."""
    from transformers import AutoTokenizer

    shutil.copytree(tiny_model, dest)
    tokenizer = AutoTokenizer.from_pretrained(dest)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    tokenizer.save_pretrained(dest)
    return str(dest)
