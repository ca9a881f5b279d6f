"""A length penalty: 0 up to `free_chars` characters, then down to -1 at `max_chars` (and
below it, -1): trained with a small weight, it makes long answers cost a little. The numbers
are passed from the config (`kwargs`).

    reward:
      components:
        - {kind: exec}
        - {kind: function, fn: examples/rewards/length_penalty.py:length_penalty, weight: 0.1,
           kwargs: {free_chars: 400, max_chars: 1600}}
"""


def length_penalty(completion: str, free_chars: int = 400, max_chars: int = 1600) -> float:
    over = len(completion) - free_chars
    if over <= 0:
        return 0.0
    return -min(1.0, over / max(1, max_chars - free_chars))
