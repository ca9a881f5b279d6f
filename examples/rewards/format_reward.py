"""A format reward: 1.0 when the answer is exactly one fenced code block tagged with the task's
language and nothing else, 0.5 for one such block with prose around it, 0.0 otherwise.

    reward.functions: [examples/rewards/format_reward.py:one_fence@0.3]
"""

import re

FENCE = re.compile(r"```([A-Za-z0-9_+#-]*)[^\n]*\n.*?```", re.DOTALL)
TAGS = {"python": {"python", "py", "python3"}, "cpp": {"cpp", "c++"}, "rust": {"rust", "rs"}}


def one_fence(completion: str, language: str) -> float:
    blocks = list(FENCE.finditer(completion))
    if len(blocks) != 1 or blocks[0].group(1).lower() not in TAGS.get(language, {language}):
        return 0.0
    rest = completion[:blocks[0].start()] + completion[blocks[0].end():]
    return 1.0 if not rest.strip() else 0.5
